"""The debian-text corpus (configs/data/debian-text.yaml, docs/corpus.md): English text from pinned Debian packages,
fetched with `apt-get download pkg=version`, checked by sha256, unpacked with `dpkg -x`, cleaned and cut into jsonl
documents (a page of consecutive dictionary entries, one documentation file), 1% of the documents held out by a hash
of their id, and checked again: the sha256 of every file written must match the pinned CORPUS_SHA256.

    .venv/bin/python scripts/get_corpus.py [--out corpus/debian-text] [--debs corpus/debs]

`make corpus` runs it, then `diffllm data prepare data=debian-text`. Standard library only (plus apt-get and dpkg).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

VAL_FRACTION = 0.01  # share of each source's characters held out, in whole documents chosen by a hash of their id
PAGE_CHARS = 4000  # a dictionary document: consecutive entries up to at least this many characters of clean text
SHARD_CHARS = 4_000_000  # training documents per jsonl file: about this many characters
MIN_DOC_CHARS = 300  # a documentation file shorter than this after cleaning (a bare toctree) is left out
# sha256 of SHA256SUMS (the sha256 of every file written, by name): pins the extracted texts
CORPUS_SHA256 = "027fba13906ba2b0602301b60b0c04d4839891f32d0098ae51d5005cf88a6f2d"


@dataclass(frozen=True)
class Package:
    """One source of the corpus: a Debian package at an exact version and the sha256 of its .deb."""

    source: str  # the data config's source name (corpus/debian-text/<source>/)
    name: str
    version: str
    sha256: str
    licence: str
    extract: Callable[[Path], Iterator[tuple[str, str]]]  # unpacked tree -> (document id, text) in natural order


# ----------------------------------------------------------------------------------------------- dictd dictionaries

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64_number(s: str) -> int:
    """dictd's index numbers: base 64 digits, most significant first ('BMS7r' -> an offset)."""
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def dictd_entries(data: bytes, index: str) -> list[tuple[str, str]]:
    """(headword, entry text) of a dictd dictionary, in file order; each (offset, length) range once (an index lists
    a range under every headword that points to it); the 00-database-* header entries are left out."""
    ranges: dict[tuple[int, int], str] = {}
    for line in index.splitlines():
        word, off, length = line.split("\t")[:3]
        if word.startswith("00-database") or word.startswith("00database"):
            continue
        ranges.setdefault((b64_number(off), b64_number(length)), word)
    return [(w, _decode(data[o : o + n])) for (o, n), w in sorted(ranges.items())]


def _decode(b: bytes) -> str:
    """UTF-8, else Windows-1252 (3 GCIDE entries hold a stray cp1252 byte: 'market\x92s')."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("cp1252", errors="replace")


def unwrap(text: str, breaks: re.Pattern) -> str:
    """Paragraphs (blank-line separated) of indented, wrapped lines -> one line each; a line matching `breaks`
    (a numbered sense, 'Syn:', 'Note:') starts a new line; paragraphs are separated by one newline."""
    paras = []
    for para in re.split(r"\n\s*\n", text):
        lines = [re.sub(r"\s{2,}", " ", ln.strip()) for ln in para.splitlines() if ln.strip()]
        if not lines:
            continue
        out = [lines[0]]
        for ln in lines[1:]:
            if breaks.match(ln):
                out.append(ln)
            else:
                out[-1] += " " + ln
        paras.append("\n".join(out))
    return "\n".join(paras)


# GCIDE's dictd text writes accented letters as [<mark><letter>] or [<letter><mark>]: the mark's combining character.
_GCIDE_MARKS = {"=": "\u0304", "'": "\u0301", "`": "\u0300", "~": "\u0303", '"': "\u0308", "^": "\u0302", ".": "\u0307",
                "-": "\u0331", ",": "\u0327"}  # fmt: skip
_GCIDE_NAMED = {
    "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "eth": "ð", "thorn": "þ", "yogh": "ȝ", "ng": "ŋ", "schwa": "ə",
    "aum": "ä", "imac": "ī", "asl": "a", "add": "a\u0324", "udd": "u\u0324", "=oo": "o\u035eo", "oo^": "o\u035do",
    "=ae": "ǣ", "root": "√", "deg": "°", "sect": "§", "para": "¶", "dagger": "†", "pounds": "£", "middot": "·",
    "nbsp": " ", "ldqo": "“", "rdqo": "”", "rsquo": "’", "times": "×", "divby": "÷", "div": "÷", "rarr": "→",
    "flat": "♭", "sharp": "♯", "hand": "☞", "min": "′", "sec": "″", "bprime": "″", "dsdot": "ḍ", "lsdot": "ḷ",
    "tsdo": "ṭ", "zdot": "ż", "filig": "fi", "ffllig": "ffl", "nabla": "∇", "th": "th",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "zeta": "ζ", "eta": "η", "theta": "θ",
    "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "omicron": "ο", "pi": "π", "rho": "ρ",
    "sigma": "σ", "sigmat": "ς", "tau": "τ", "upsilon": "υ", "phi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω",
    "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Omega": "Ω",
}  # fmt: skip
_ENTITY = re.compile(r"\[([^\[\]\s]{1,7})\]")
# The sources of a GCIDE sense, on a line of their own: [1913 Webster], [WordNet 1.5 +PJC], [Century Dict. 1906], ...
_GCIDE_SOURCE = re.compile(r"^\s*\[[^\]\n]*(?:Webster|WordNet|PJC|Century|RDH|RHUD|MW10|MI11|WE1)[^\]\n]*\]\s*$", re.M)
_GCIDE_SPELLING = re.compile(r" ?\\[^\\\n]{1,80}\\")  # \Lar"i*at\ : the headword with its syllables and accents
# a pronunciation: (l[a^]r"[i^]*[a^]t), (l[aum]rkt): one word in parentheses with accent marks or entities
_GCIDE_PRON = re.compile(r" ?\((?:[^(){}\s]*[\"*`][^(){}\s]*|[a-z]*(?:\[[^\]\s]+\][a-z]*)+)\)")
_GCIDE_BREAKS = re.compile(r"(?:\d+\.|\([a-z]\)|Syn:|Note:|--\s?\w)\s")


def gcide_entity(m: re.Match) -> str:
    """[a^] -> ă, [=e] -> ē, [ae] -> æ, [alpha] -> α; anything else in brackets ([Obs.], [R.], [2]) stays."""
    name = m.group(1)
    if name in _GCIDE_NAMED:
        return _GCIDE_NAMED[name]
    if len(name) == 2 and name[0] in _GCIDE_MARKS and name[1].isalpha():
        return name[1] + _GCIDE_MARKS[name[0]]
    if len(name) == 2 and name[1] == "^" and name[0].isalpha():  # [a^]: Webster's short vowel, a breve
        return name[0] + "\u0306"
    return m.group(0)


def gcide_clean(entry: str) -> str:
    """One GCIDE entry as dictd renders it -> plain text: no syllable/accent spelling (\\Lar"i*at\\), no
    pronunciation, no source lines ([1913 Webster]), cross-references without braces, entities as Unicode letters,
    wrapped lines joined (a numbered sense, Syn: or Note: starts a line)."""
    text = _GCIDE_SOURCE.sub("", entry).replace(" [PJC]", "")
    text = _GCIDE_SPELLING.sub("", text)
    text = _GCIDE_PRON.sub("", text)
    text = text.replace("{", "").replace("}", "")
    text = _ENTITY.sub(gcide_entity, text)
    text = unwrap(text, _GCIDE_BREAKS)
    text = re.sub(r" +([,;.])", r"\1", text)
    return unicodedata.normalize("NFC", text)


_DICTD_BREAKS = re.compile(r"(?:\d+\.|Syn:|See also)\s")


def dictd_clean(entry: str) -> str:
    """A FOLDOC or Jargon File entry -> plain text: cross-references without braces, wrapped lines joined."""
    text = entry.replace("{", "").replace("}", "")
    return unicodedata.normalize("NFC", unwrap(text, _DICTD_BREAKS))


def pages(entries: Iterator[tuple[str, str]], min_chars: int = PAGE_CHARS) -> Iterator[tuple[str, str]]:
    """Consecutive cleaned entries -> pages of at least min_chars characters (the last may be shorter), each
    (id 'p<n>:<first headword>', text with entries separated by a blank line)."""
    buf: list[str] = []
    first, n, size = "", 0, 0
    for word, text in entries:
        if not text.strip():
            continue
        if not buf:
            first = word
        buf.append(text)
        size += len(text)
        if size >= min_chars:
            yield f"p{n:05d}:{first}", "\n\n".join(buf)
            buf, n, size = [], n + 1, 0
    if buf:
        yield f"p{n:05d}:{first}", "\n\n".join(buf)


def dictd_pages(name: str, clean: Callable[[str], str]) -> Callable[[Path], Iterator[tuple[str, str]]]:
    def extract(root: Path) -> Iterator[tuple[str, str]]:
        folder = root / "usr/share/dictd"
        data = gzip.decompress((folder / f"{name}.dict.dz").read_bytes())
        index = (folder / f"{name}.index").read_text(encoding="utf-8")
        yield from pages((w, clean(t)) for w, t in dictd_entries(data, index))

    return extract


# ------------------------------------------------------------------------------------------ reST and POD documentation

# Directives that Sphinx fills from elsewhere (C sources, other files): their lines carry no prose of their own.
_RST_FILLED = re.compile(r"^\.\. (?:kernel-doc|kernel-abi|kernel-feat|kernel-include|include|literalinclude)::")


def rst_clean(text: str) -> str:
    """reST kept as written (its markup is the text's own), less the SPDX licence comment, the directives that
    Sphinx fills from other files (with their indented options) and runs of blank lines; trailing spaces cut."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if skipping and (line.startswith((" ", "\t")) and line.strip()):
            continue
        skipping = False
        if line.startswith(".. SPDX-License-Identifier:"):
            continue
        if _RST_FILLED.match(line):
            skipping = True
            continue
        out.append(line.rstrip())
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()
    return unicodedata.normalize("NFC", text)


def doc_files(base: Path, keep: Callable[[str], bool], read: Callable[[Path], str]) -> Iterator[tuple[str, str]]:
    """(path relative to base, cleaned text) of every regular file (no symlinks) that `keep` accepts, sorted by
    path; files shorter than MIN_DOC_CHARS after cleaning are left out."""
    paths = sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink())
    for p in paths:
        rel = p.relative_to(base).as_posix()
        if keep(rel):
            text = rst_clean(read(p))
            if len(text) >= MIN_DOC_CHARS:
                yield rel, text


def _gunzip_text(p: Path) -> str:
    return gzip.decompress(p.read_bytes()).decode("utf-8", errors="replace")


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def linux_keep(rel: str) -> bool:
    """Kernel documentation in English: reST and text files, and the extension-less ABI and top-level files; not
    the translations, not the devicetree YAML schemas, scripts, images or Sphinx's own files."""
    if not rel.endswith(".gz") or rel.startswith(("translations/", "sphinx", "images/")):
        return False
    name = rel[: -len(".gz")]
    stem = name.rsplit("/", 1)[-1]
    if name.endswith((".rst", ".txt")):
        return True
    return "." not in stem and stem not in ("Makefile", "Kconfig", "dontdiff")


def linux_docs(root: Path) -> Iterator[tuple[str, str]]:
    return doc_files(root / "usr/share/doc/linux-doc-6.1/Documentation", linux_keep, _gunzip_text)


def python_docs(root: Path) -> Iterator[tuple[str, str]]:
    base = root / "usr/share/doc/python3.11/html/_sources"
    return doc_files(base, lambda rel: rel.endswith(".rst.txt"), _text)


def perl_docs(root: Path) -> Iterator[tuple[str, str]]:
    return doc_files(root / "usr/share/perl/5.36.0/pod", lambda rel: rel.endswith(".pod"), _text)


# --------------------------------------------------------------------------------------------------------- packages

PACKAGES = [
    Package("gcide", "dict-gcide", "0.48.5+nmu2",
            "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f", "GPL-2+",
            dictd_pages("gcide", gcide_clean)),
    Package("linux-doc", "linux-doc-6.1", "6.1.176-1",
            "0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f", "GPL-2", linux_docs),
    Package("python-doc", "python3.11-doc", "3.11.2-6+deb12u8",
            "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b", "PSF-2.0", python_docs),
    Package("perl-doc", "perl-doc", "5.36.0-7+deb12u3",
            "e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591", "GPL-1+ or Artistic", perl_docs),
    Package("foldoc", "dict-foldoc", "20230119-1",
            "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3", "GFDL-1.1+ (no invariant sections)",
            dictd_pages("foldoc", dictd_clean)),
    Package("jargon", "dict-jargon", "4.4.7-3.1",
            "405f8168d7994ed2cb71407bb95493daec2e9aa66fc0461dafa74a9d6728a8c1", "public domain",
            dictd_pages("jargon", dictd_clean)),
]  # fmt: skip


# ----------------------------------------------------------------------------------------------- split and write


def _hash01(*parts: str) -> float:
    return int(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16], 16) / 2**64


def held_out(source: str, docs: list[tuple[str, str]], fraction: float = VAL_FRACTION) -> set[str]:
    """The ids of the held-out documents: whole documents taken in an order hashed from (source, id), each one
    that still fits, until `fraction` of the source's characters (so one long manual page cannot make a source's
    held-out share several times the others'). The same on every machine, whatever the file layout."""
    budget = fraction * sum(len(t) for _, t in docs)
    chosen: set[str] = set()
    for doc_id, text in sorted(docs, key=lambda d: _hash01("val", source, d[0])):
        if len(text) <= budget:
            chosen.add(doc_id)
            budget -= len(text)
    return chosen


def split(source: str, docs: list[tuple[str, str]], shard_chars: int = SHARD_CHARS) -> dict[str, list]:
    """{file name: [(id, text)]}: the held-out documents in val.jsonl, the others in train-NN.jsonl files of about
    shard_chars characters; each file's documents in a hashed order, so any prefix of the stream samples the whole
    source (a dictionary's letters, every part of a manual)."""
    ids = [d for d, _ in docs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: a document id occurs twice")
    val_ids = held_out(source, docs)
    docs = sorted(docs, key=lambda d: _hash01("order", source, d[0]))
    val = [d for d in docs if d[0] in val_ids]
    train = [d for d in docs if d[0] not in val_ids]
    total = sum(len(t) for _, t in train)
    n = max(1, round(total / shard_chars))
    files: dict[str, list] = {f"train-{i:02d}.jsonl": [] for i in range(n)}
    done = 0
    for doc in train:
        files[f"train-{min(n - 1, done * n // max(total, 1)):02d}.jsonl"].append(doc)
        done += len(doc[1])
    files["val.jsonl"] = val
    return files


def write_jsonl(path: Path, docs: list[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for doc_id, text in docs:
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class CorpusError(Exception):
    """One line naming the package or file at fault."""


def fetch_deb(pkg: Package, debs: Path) -> Path:
    """The package's .deb in debs/ (downloaded once with apt-get), its sha256 checked."""
    debs.mkdir(parents=True, exist_ok=True)
    path = debs / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_all.deb"
    if not path.exists():
        if shutil.which("apt-get") is None:
            raise CorpusError(f"{pkg.name}={pkg.version}: apt-get not found (a Debian or Ubuntu machine is needed)")
        got = subprocess.run(
            ["apt-get", "download", "-q", f"{pkg.name}={pkg.version}"], cwd=debs, capture_output=True, text=True
        )
        if got.returncode != 0 or not path.exists():
            why = (got.stderr.strip().splitlines() or ["no .deb written"])[-1]
            raise CorpusError(
                f"apt-get download {pkg.name}={pkg.version} failed ({why}); run `apt-get update` first, or, if the "
                f"mirror no longer has this version, put {path.name} from Debian's snapshot archive in {debs}"
            )
    digest = sha256_file(path)
    if digest != pkg.sha256:
        raise CorpusError(f"{path}: sha256 {digest}, expected {pkg.sha256} (a different build); delete it and rerun")
    return path


def build(out: Path, debs: Path, verify: bool = True) -> dict:
    """Fetch, check, extract and write the whole corpus into out (atomically: written aside, then renamed)."""
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    stats: dict = {"packages": {}, "val_fraction": VAL_FRACTION}
    try:
        for pkg in PACKAGES:
            deb = fetch_deb(pkg, debs)
            with tempfile.TemporaryDirectory() as unpacked:
                subprocess.run(["dpkg", "-x", str(deb), unpacked], check=True)
                docs = list(pkg.extract(Path(unpacked)))
                licence = next(Path(unpacked).glob("usr/share/doc/*/copyright")).read_bytes()
            (tmp / pkg.source).mkdir()
            (tmp / pkg.source / "copyright").write_bytes(licence)
            files = split(pkg.source, docs)
            for name, part in files.items():
                write_jsonl(tmp / pkg.source / name, part)
            val = files["val.jsonl"]
            stats["packages"][pkg.source] = {
                "package": f"{pkg.name}={pkg.version}",
                "licence": pkg.licence,
                "docs": len(docs),
                "chars": sum(len(t) for _, t in docs),
                "val_docs": len(val),
                "val_chars": sum(len(t) for _, t in val),
                "train_files": len(files) - 1,
            }
            print(f"{pkg.source:>10}: {json.dumps(stats['packages'][pkg.source])}", flush=True)
        sums = "".join(
            f"{sha256_file(p)}  {p.relative_to(tmp).as_posix()}\n" for p in sorted(tmp.rglob("*")) if p.is_file()
        )
        (tmp / "SHA256SUMS").write_text(sums)
        digest = hashlib.sha256(sums.encode()).hexdigest()
        stats["sha256"] = digest
        if verify and digest != CORPUS_SHA256:
            raise CorpusError(
                f"the extracted texts differ from the pinned ones (sha256 of SHA256SUMS {digest}, expected "
                f"{CORPUS_SHA256}); if scripts/get_corpus.py's extraction was changed on purpose, pin the new value"
            )
        (tmp / "corpus.json").write_text(json.dumps(stats, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="corpus/debian-text", help="the corpus folder (default: %(default)s)")
    ap.add_argument("--debs", default="corpus/debs", help="where the .deb files are kept (default: %(default)s)")
    ap.add_argument("--no-verify", action="store_true", help="write the texts even if they differ from the pin")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if (out / "corpus.json").exists():
        print(f"{out}: already built ({json.loads((out / 'corpus.json').read_text())['sha256']}); delete it to rebuild")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        stats = build(out, Path(args.debs), verify=not args.no_verify)
    except CorpusError as e:
        print(f"get_corpus: error: {e}", file=sys.stderr)
        return 2
    total = sum(p["chars"] for p in stats["packages"].values())
    print(f"{out}: {total:,} characters in {len(stats['packages'])} sources, sha256 {stats['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
