"""The debian-text corpus (scripts/get_corpus.py, configs/data/debian-text.yaml): its cleanup of GCIDE, FOLDOC and
reST on small inline samples, the dictd index reader, the held-out split and the .deb check, all without a download;
and, when `make corpus` has built it here, that the data config resolves to it and weighs each source by its tokens."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from diffllm.config import build, compose
from diffllm.data import DataConfig

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("get_corpus", ROOT / "scripts" / "get_corpus.py")
gc = importlib.util.module_from_spec(spec)
sys.modules.setdefault("get_corpus", gc)  # its dataclass looks its module up while the module executes
spec.loader.exec_module(gc)

LARIAT = """Lariat \\Lar"i*at\\ (l[a^]r"[i^]*[a^]t), n. [Sp. la reata the
   rope; la the + reata rope. Cf. {Reata}.]
   A long, slender rope made of hemp or strips of hide, esp. one
   with a noose; -- used as a lasso for catching cattle. [Western U.S.]
   [1913 Webster]
"""

ABDICATE = """Abdicate \\Ab"di*cate\\, v. t. [imp. & p. p. {Abdicated}; p. pr. &
   vb. n. {Abdicating}.] [L. abdicatus, p. p. of abdicare.]
   1. To surrender or relinquish, as sovereign power.
      [1913 Webster]

            He abdicates all right to be his own governor.
                                                  --Burke.
      [1913 Webster +PJC]

   2. To reject; to cast off. [Obs.] --Bp. Hall.
      [1913 Webster]

   Syn: To give up; quit; vacate.
        [WordNet 1.5]
"""


def test_gcide_entry_becomes_plain_text():
    """Spelling, pronunciation, source lines and braces go; the headword, labels, senses and quotes stay."""
    assert gc.gcide_clean(LARIAT) == (
        "Lariat, n. [Sp. la reata the rope; la the + reata rope. Cf. Reata.] A long, slender rope made of hemp or "
        "strips of hide, esp. one with a noose; -- used as a lasso for catching cattle. [Western U.S.]"
    )
    assert gc.gcide_clean(ABDICATE) == (
        "Abdicate, v. t. [imp. & p. p. Abdicated; p. pr. & vb. n. Abdicating.] [L. abdicatus, p. p. of abdicare.]\n"
        "1. To surrender or relinquish, as sovereign power.\n"
        "He abdicates all right to be his own governor. --Burke.\n"
        "2. To reject; to cast off. [Obs.] --Bp. Hall.\n"
        "Syn: To give up; quit; vacate."
    )


def test_gcide_entities_are_unicode_letters():
    """Accent entities become NFC letters, named ones their symbol; a bracketed label is text and stays."""
    text = gc.gcide_clean("Lark \\Lark\\, n. [AS. l[=a]werce, Icel. l[ae]virki; Larid[ae], [alpha], caf['e], [R.]]")
    assert text == "Lark, n. [AS. lāwerce, Icel. lævirki; Laridæ, α, café, [R.]]"
    assert gc.gcide_clean('Pr[oe]cis \\Pr[oe]cis\\ (pr[asl]*s[=e]"), n. na[i^]ve') == "Prœcis, n. naĭve"


def test_foldoc_entry_is_unwrapped():
    entry = "Actors\n\n   <theory> A model for {concurrency} by {Carl\n   Hewitt}.\n\n   (1999-11-23)\n"
    assert gc.dictd_clean(entry) == "Actors\n<theory> A model for concurrency by Carl Hewitt.\n(1999-11-23)"


def _b64(n: int) -> str:
    """dictd's base-64 numbers, written independently of the reader under test."""
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = digits[n % 64]
    while n >= 64:
        n //= 64
        out = digits[n % 64] + out
    return out


def test_dictd_index_reads_each_range_once_in_file_order():
    """Entries come in file order, a range listed under two headwords once (under its first), headers skipped."""
    parts = ["header text\n", "apple: a fruit\n", "bee: an insect ✓\n"]
    offsets = [sum(len(p.encode()) for p in parts[:i]) for i in range(len(parts))]
    sizes = [len(p.encode()) for p in parts]
    rows = [("00-database-info", 0), ("bee", 2), ("apple", 1), ("Bee", 2)]
    index = "\n".join(f"{w}\t{_b64(offsets[i])}\t{_b64(sizes[i])}" for w, i in rows) + "\n"
    assert gc.b64_number(_b64(4_000_123)) == 4_000_123
    assert gc.dictd_entries("".join(parts).encode(), index) == [("apple", parts[1]), ("bee", parts[2])]


def test_pages_group_consecutive_entries():
    entries = [(f"w{i}", "x" * 30) for i in range(10)]
    got = list(gc.pages(iter(entries), min_chars=100))
    assert [i for i, _ in got] == ["p00000:w0", "p00001:w4", "p00002:w8"]
    assert [t.count("x") for _, t in got] == [120, 120, 60]


def test_rst_keeps_the_text_and_drops_what_sphinx_fills_in():
    rst = (
        ".. SPDX-License-Identifier: GPL-2.0\n\nTitle\n=====\n\n\n\nSome :c:func:`kmalloc` prose.\n\n"
        ".. kernel-doc:: include/linux/slab.h\n   :internal:\n\n.. note::\n   Kept.   \n"
    )
    assert gc.rst_clean(rst) == "Title\n=====\n\nSome :c:func:`kmalloc` prose.\n\n.. note::\n   Kept."


def test_linux_files_kept():
    keep = gc.linux_keep
    assert keep("admin-guide/README.rst.gz") and keep("memory-barriers.txt.gz") and keep("ABI/testing/sysfs-bus-pci.gz")
    assert not keep("translations/zh_CN/index.rst.gz") and not keep("devicetree/bindings/arm/cpus.yaml.gz")
    assert not keep("conf.py.gz") and not keep("Makefile.gz") and not keep("admin-guide/README.rst")


def test_split_holds_out_whole_documents_near_the_fraction():
    """Every document lands in exactly one file; about 1% of the characters (never more) are held out in whole
    documents; the choice depends only on the ids, not on the order the documents come in."""
    docs = [(f"doc{i}", "y" * (100 + 37 * (i % 50))) for i in range(3000)] + [("huge", "z" * 200_000)]
    files = gc.split("src", docs, shard_chars=1_000_000)
    val_ids = {d for d, _ in files["val.jsonl"]}
    train_ids = [d for name, part in files.items() if name != "val.jsonl" for d, _ in part]
    assert sorted(train_ids + list(val_ids)) == sorted(d for d, _ in docs) and not val_ids & set(train_ids)
    total = sum(len(t) for _, t in docs)
    held = sum(len(t) for _, t in files["val.jsonl"])
    assert 0.0095 * total < held <= 0.01 * total and "huge" not in val_ids
    assert {d for d, _ in gc.split("src", docs[::-1], shard_chars=1_000_000)["val.jsonl"]} == val_ids
    assert len(files) - 1 == round((total - held) / 1_000_000)


def test_a_deb_with_another_sha256_is_refused(tmp_path):
    """A .deb already in the folder is checked, not trusted (no download: the file is there)."""
    pkg = gc.PACKAGES[-1]
    (tmp_path / f"{pkg.name}_{pkg.version}_all.deb").write_bytes(b"not the package")
    with pytest.raises(gc.CorpusError, match=f"sha256 {hashlib.sha256(b'not the package').hexdigest()}, expected"):
        gc.fetch_deb(pkg, tmp_path)


def test_data_config_names_every_source_of_the_script():
    """The config composes and builds; its training and held-out sources are the script's, in its folder."""
    data = build(DataConfig, compose("train", ["data=debian-text"]).data, "data")
    names = [p.source for p in gc.PACKAGES]
    assert [s.name for s in data.sources] == names
    assert [s.name for s in data.val] == [f"{n}-heldout" for n in names]
    assert all(s.paths == [f"corpus/debian-text/{s.name}/train-*.jsonl"] for s in data.sources)
    assert data.prepared_dir == "prepared/debian-text" and data.val_fraction == 0.0


CORPUS = ROOT / "corpus" / "debian-text"
PREPARED = ROOT / "prepared" / "debian-text"


@pytest.mark.skipif(not (CORPUS / "corpus.json").exists(), reason="corpus/debian-text not built here (`make corpus`)")
def test_built_corpus_resolves_and_matches_its_pin(monkeypatch):
    """Built here: every source resolves to its files, and the files are the ones SHA256SUMS lists and the script
    pins; prepared: each weight is the source's share of the prepared training tokens (to 3 digits)."""
    from diffllm.data.loader import resolve_sources

    monkeypatch.chdir(ROOT)
    data = build(DataConfig, compose("train", ["data=debian-text", "data.prepared_dir=null"]).data, "data")
    for src in resolve_sources(data) + resolve_sources(data, val=True):
        assert src.n_files >= 1
    sums = (CORPUS / "SHA256SUMS").read_text()
    assert hashlib.sha256(sums.encode()).hexdigest() == gc.CORPUS_SHA256
    for line in sums.splitlines()[:3]:
        digest, name = line.split("  ")
        assert gc.sha256_file(CORPUS / name) == digest
    if not all((PREPARED / s.name / "meta.json").exists() for s in data.sources):
        pytest.skip("prepared/debian-text not prepared here (`make corpus`)")
    tokens = {s.name: json.loads((PREPARED / s.name / "meta.json").read_text())["tokens"] for s in data.sources}
    weights = {s.name: s.weight for s in data.sources}
    for name in tokens:
        assert weights[name] / sum(weights.values()) == pytest.approx(tokens[name] / sum(tokens.values()), abs=1e-3)
