"""Sources resolved to files (globs, `pkg:` paths, hub names, prepared shards), checked, fingerprinted, and read."""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np

from . import icl, needle, recall
from .batch import Marked
from .config import DataError, SourceConfig
from .progress import quiet_library_bars

SUFFIX_FORMAT = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".md": "text"}
HEAD_BYTES = 1 << 16  # fingerprint: size + hash of the first 64 KiB of each file
READ_BATCH = 256  # examples per arrow batch when streaming
SNIFF_BYTES = 8192  # text and json files: the first 8 KiB must look like UTF-8 text
SYNTHETIC = {
    "needle": (needle.NeedleSpec, needle.documents),
    "recall": (recall.RecallSpec, recall.documents),
    "icl": (icl.IclSpec, icl.documents),
}
MAX_UNDECODABLE = 0.2  # ... at most this share of their characters undecodable (U+FFFD after decoding)


Doc = Union[str, Marked, np.ndarray, None]  # text (raw sources), token ids (prepared), None (missing/null text)


@dataclass
class Source:
    """One source resolved to an ordered list of files (hub: shards), ready to be read by any rank or worker."""

    cfg: SourceConfig
    kind: str  # json | parquet | text | hub | prepared | needle | recall | icl (SYNTHETIC: generated)
    files: list  # absolute paths (hub: shard labels; prepared: the original files' labels)
    fingerprint: str
    prepared: Optional[str] = None  # directory of pre-tokenized shards

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def n_files(self) -> int:
        return len(self.files)


def _expand(pattern: str, where: str) -> list[str]:
    if pattern.startswith("pkg:"):
        module, _, rel = pattern[4:].partition("/")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise DataError(f"{where}.path: {pattern}: package {module!r} is not installed")
        pattern = str(Path(list(spec.submodule_search_locations)[0]) / rel)
    pattern = os.path.abspath(os.path.expanduser(pattern))
    if glob.has_magic(pattern):
        found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not found:
            raise DataError(f"{where}.path: {pattern}: no files match")
        return found
    if os.path.isdir(pattern):
        raise DataError(f"{where}.path: {pattern}: is a directory; give a glob such as {pattern}/*.jsonl")
    if not os.path.exists(pattern):
        raise DataError(f"{where}.path: {pattern}: no such file")
    return [pattern]


def _check_file(path: str, kind: str, where: str) -> str:
    """Readable, non-empty, plausible; returns a fingerprint line (relative name added by the caller)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            if kind == "parquet" and size >= 8:
                f.seek(size - 4)
                tail = f.read(4)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if size == 0:
        raise DataError(
            f"{path}: empty file (0 bytes); delete it, or leave it out with {where}.exclude: "
            f"[{os.path.basename(path)!r}] in the data config"
        )
    if kind == "parquet" and (size < 8 or head[:4] != b"PAR1" or tail != b"PAR1"):
        raise DataError(f"{path}: corrupt parquet (no PAR1 magic at start and end; truncated or not parquet)")
    if kind in ("text", "json"):
        _check_text(path, head[:SNIFF_BYTES])
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pq.read_metadata(path)  # the footer: one small read
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad footer
            raise DataError(f"{path}: corrupt parquet footer ({_one_line(e)})") from None
    return f"{size}:{hashlib.sha256(head).hexdigest()}"


def _check_text(path: str, sample: bytes) -> None:
    """Refuse a file whose first bytes are not text: NUL bytes, or mostly invalid UTF-8 (a binary file, an archive,
    a UTF-16 file). A few invalid bytes (e.g. Latin-1 accents) pass: they are replaced by U+FFFD and counted."""
    import codecs

    text = codecs.getincrementaldecoder("utf-8")("replace").decode(sample, final=False)  # a cut last char is no error
    bad = text.count("\ufffd")
    nul = sample.count(0)
    if nul > len(sample) // 100 or bad > MAX_UNDECODABLE * max(1, len(text)):
        what = f"{nul} NUL bytes" if nul > len(sample) // 100 else f"{bad} of {len(text)} characters are not UTF-8"
        raise DataError(
            f"{path}: not UTF-8 text ({what} in its first {len(sample):,} bytes): a binary file, an archive "
            "or another encoding? Convert it to UTF-8, or leave it out (the source's exclude: [...])"
        )


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _semantic(cfg: SourceConfig) -> dict:
    """The settings that change which documents a source yields (weight does not)."""
    d = asdict(cfg)
    d.pop("weight")
    return d


def resolve(cfg: SourceConfig, where: str, prepared_dir: Optional[str] = None) -> Source:
    """Files of one source, checked (readable, non-empty, parquet magic) and fingerprinted. A synthetic source
    (format needle, recall or icl) is generated on the fly, prepared_dir or not: `data prepare` skips it."""
    if prepared_dir and cfg.format not in SYNTHETIC:
        return _resolve_prepared(cfg, where, Path(prepared_dir) / cfg.name)
    if cfg.format == "hub":
        return _resolve_hub(cfg, where)
    if cfg.format in SYNTHETIC:  # synthetic documents, generated on the fly (diffllm/data/needle.py, recall.py, icl.py)
        try:
            spec = SYNTHETIC[cfg.format][0].parse(cfg.paths[0])
            return Source(cfg, cfg.format, [cfg.paths[0]], _digest(cfg.format, spec.fingerprint()))
        except ValueError as e:
            raise DataError(f"{where}.{e}") from None
    files = [f for p in cfg.paths for f in _expand(p, where)]
    kept = [
        f
        for f in files
        if not any(fnmatch.fnmatch(os.path.basename(f), x) or fnmatch.fnmatch(f, x) for x in cfg.exclude)
    ]
    if not kept:
        raise DataError(f"{where}: every file matching {cfg.paths} is excluded by {where}.exclude")
    if len(set(kept)) != len(kept):
        raise DataError(f"{where}.path: a file is listed twice ({sorted(f for f in kept if kept.count(f) > 1)[0]})")
    kinds = {cfg.format if cfg.format != "auto" else SUFFIX_FORMAT.get(Path(f).suffix.lower()) for f in kept}
    kinds = {"json" if k == "jsonl" else k for k in kinds}
    if None in kinds:
        bad = next(f for f in kept if Path(f).suffix.lower() not in SUFFIX_FORMAT)
        raise DataError(
            f"{where}.format: cannot infer the format of {bad} from its suffix; set format: jsonl|parquet|text"
        )
    if len(kinds) > 1:
        raise DataError(f"{where}: files of several formats {sorted(kinds)}; split them into one source per format")
    kind = kinds.pop()
    root = os.path.commonpath([os.path.dirname(f) for f in kept])
    lines = [f"{os.path.relpath(f, root)}:{_check_file(f, kind, where)}" for f in kept]
    return Source(cfg, kind, kept, _digest(kind, cfg.text_field, cfg.sample_by, lines))


def _resolve_hub(cfg: SourceConfig, where: str) -> Source:
    name = cfg.paths[0]
    try:
        n = _load_hub(cfg).n_shards
    except Exception as e:  # the hub client raises many types; all mean "cannot open"
        raise DataError(f"{where}: cannot open hub dataset {name!r}: {_one_line(e)}") from None
    labels = [f"{name}#{i}" for i in range(n)]
    return Source(cfg, "hub", labels, _digest("hub", name, cfg.hub_config, cfg.split, cfg.revision, cfg.text_field, n))


def _resolve_prepared(cfg: SourceConfig, where: str, folder: Path) -> Source:
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        raise DataError(f"{meta_path}: missing; run `diffllm data prepare` for source {cfg.name!r} ({where})")
    meta = json.loads(meta_path.read_text())
    if meta.get("source") != json.loads(json.dumps(_semantic(cfg))):
        raise DataError(
            f"{meta_path}: prepared from a different config of source {cfg.name!r}; re-run `diffllm data prepare`"
        )
    for i in range(len(meta["files"])):
        for part in (_shard_path(folder, i, "bin"), _shard_path(folder, i, "idx.npy")):
            if not part.exists():
                raise DataError(f"{part}: missing prepared shard of source {cfg.name!r}; re-run `diffllm data prepare`")
    return Source(cfg, "prepared", meta["files"], meta["fingerprint"], prepared=str(folder))


def _shard_path(folder: Path, i: int, ext: str) -> Path:
    return Path(folder) / f"shard-{i:05d}.{ext}"


def hub_args(cfg: SourceConfig) -> tuple[tuple, dict]:
    """What datasets.load_dataset receives for a hub source: (args, kwargs); always streamed, never downloaded whole."""
    return (cfg.paths[0], cfg.hub_config), {"split": cfg.split, "revision": cfg.revision, "streaming": True}


def _load_hub(cfg: SourceConfig):
    from datasets import load_dataset

    quiet_library_bars()

    args, kwargs = hub_args(cfg)
    return load_dataset(*args, **kwargs)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class Reader:
    """Documents of one source by (file, example index); opened lazily so each worker process opens its own.
    skip_bad (data.on_bad_record=skip): a JSON-lines file with lines that are not valid JSON is read line by line
    instead, those lines skipped; `skipped[(file, example)]` then holds how many of them precede that example (the
    last example also owns those after it), for the reader of that example to count."""

    def __init__(self, src: Source, tokenizer_fingerprint: Optional[str] = None, skip_bad: bool = False):
        self.src = src
        self._ds = None
        self._tok_fp = tokenizer_fingerprint
        self.skip_bad = skip_bad
        self.skipped: dict[tuple[int, int], int] = {}

    def _dataset(self):
        if self._ds is None:
            from datasets import load_dataset

            quiet_library_bars()  # a log file gets no "Resolving data files" bars
            # its "Failed to load JSON from file ..." line: ours names the file and line instead (docs below)
            logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
            cfg = self.src.cfg
            if self.src.kind == "hub":
                self._ds = _load_hub(cfg)
            else:
                kw = {"sample_by": cfg.sample_by, "encoding_errors": "replace"} if self.src.kind == "text" else {}
                try:
                    self._ds = load_dataset(
                        self.src.kind, data_files=self.src.files, split="train", streaming=True, **kw
                    )
                except Exception as e:
                    raise DataError(
                        f"source {self.src.name!r}: cannot open its {self.src.kind} files ({_one_line(e)})"
                    ) from None
            if self._ds.n_shards != self.src.n_files:
                raise DataError(
                    f"source {self.src.name!r}: the dataset has {self._ds.n_shards} shards, expected {self.src.n_files}"
                )
        return self._ds

    def docs(self, f: int, start: int, stride: int) -> Iterator[tuple[int, Doc, int]]:
        """(example index, document, undecodable count) for examples start, start+stride, ... of file f."""
        if self.src.kind == "prepared":
            yield from self._prepared_docs(f, start, stride)
            return
        if self.src.kind in SYNTHETIC:
            spec, documents = SYNTHETIC[self.src.kind]
            yield from documents(spec.parse(self.src.files[f]), f, start, stride)
            return
        label = self.src.files[f]
        ds = self._dataset().shard(num_shards=self.src.n_files, index=f, contiguous=True)
        if start:
            ds = ds.skip(start)
        j, field = start, self.src.cfg.text_field
        try:
            for table in ds.with_format("arrow").iter(batch_size=READ_BATCH):
                if field not in table.column_names:
                    raise DataError(
                        f"{label}: example {j} has no field {field!r} (fields: {', '.join(table.column_names)})"
                    )
                for text in _texts(table.column(field), label, field):
                    if (j - start) % stride == 0:
                        yield j, text, (text.count("\ufffd") if text else 0)
                    j += 1
        except DataError:
            raise
        except Exception as e:  # pyarrow/json/OS errors from the reader: name the file (and line)
            bad = _bad_json_lines(label) if self.src.kind == "json" else None
            if not bad:
                raise DataError(f"{label}: cannot read {self.src.kind} ({_one_line(e)})") from None
            if not self.skip_bad:
                line, why = bad[0]
                raise DataError(
                    f"{label}:{line}: not valid JSON ({why}; {len(bad) - 1} such line(s) in the file); fix or delete "
                    "it, or set data.on_bad_record=skip to skip such records and count them"
                ) from None
        else:
            return
        yield from self._good_json_lines(f, j, start, stride, bad)

    def _good_json_lines(self, f: int, j: int, start: int, stride: int, bad: list) -> Iterator[tuple[int, Doc, int]]:
        """The rest of file f from example j on, read line by line without its `bad` lines (data.on_bad_record=skip):
        the examples are the file's valid records, numbered as the arrow reader numbers them. Each bad line is
        counted with the next example (those after the last example, with it), so once by whichever stream reads it."""
        label, field = self.src.files[f], self.src.cfg.text_field
        *bad, (last, _) = bad
        skip = {line for line, _ in bad}
        _say_skipped(label, bad)
        k, owed = 0, 0
        with open(label, encoding="utf-8", errors="replace") as lines:
            for n, line in enumerate(lines, 1):
                if n in skip:
                    owed += 1
                    continue
                if not line.strip():
                    continue
                if n == last:
                    owed += sum(b > last for b in skip)
                mine, owed_here, owed = k >= j and (k - start) % stride == 0, owed, 0
                if mine:
                    record = json.loads(line)
                    if not isinstance(record, dict) or field not in record:
                        raise DataError(f"{label}:{n}: example {k} has no field {field!r}")
                    text = record[field]
                    if text is not None and not isinstance(text, str):
                        raise DataError(f"{label}:{n}: field {field!r} holds {type(text).__name__}, not text")
                    self.skipped[(f, k)] = owed_here
                    yield k, text, (text.count("\ufffd") if text else 0)
                k += 1

    def _prepared_docs(self, f: int, start: int, stride: int) -> Iterator[tuple[int, Doc, int]]:
        folder = Path(self.src.prepared)
        idx = np.load(_shard_path(folder, f, "idx.npy"))  # (n_docs, 2|3): end offset, undecodable, records skipped
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("bad_records") and not self.skip_bad:
            raise DataError(
                f"{folder}: prepared with data.on_bad_record=skip ({meta['bad_records']:,} malformed records skipped); "
                "train on it with data.on_bad_record=skip, or fix the source and re-run `diffllm data prepare`"
            )
        if self._tok_fp and meta["tokenizer"] != self._tok_fp:
            raise DataError(
                f"{folder}: prepared with another tokenizer ({meta['tokenizer']} != {self._tok_fp}); re-run `diffllm "
                "data prepare`"
            )
        tokens = (
            np.memmap(_shard_path(folder, f, "bin"), dtype=meta["dtype"], mode="r")
            if len(idx) and idx[-1, 0]
            else np.zeros(0)
        )
        for j in range(start, len(idx), stride):
            lo = idx[j - 1, 0] if j else 0
            if idx.shape[1] > 2 and idx[j, 2]:
                self.skipped[(f, j)] = int(idx[j, 2])  # counted by the reader of example j, as for the raw file
            yield j, np.asarray(tokens[lo : idx[j, 0]], dtype=np.int32), int(idx[j, 1])


def _bad_json_lines(path: str) -> list[tuple[int, str]]:
    """(line number, why) of each non-blank line of a JSON-lines file that is not a JSON object; last, (the number of
    the last good line, "") when there are any."""
    bad, last = [], 0
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for n, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        ok = isinstance(json.loads(line.rstrip("\r\n")), dict)
                    except json.JSONDecodeError as e:
                        bad.append((n, f"{e.msg}, column {e.colno}"))
                        continue
                    if not ok:
                        bad.append((n, "not a JSON object"))
                    else:
                        last = n
    except OSError:  # gone or unreadable: the reader's own error says so
        return []
    return bad + [(last, "")] if bad else []


_SAID: set = set()


def _say_skipped(label: str, bad: list) -> None:
    """Once per file and process: which lines data.on_bad_record=skip skips."""
    if label not in _SAID:
        from .progress import say

        _SAID.add(label)
        line, why = bad[0]
        say(
            f"{label}:{line}: not valid JSON ({why}): skipped, with {len(bad) - 1} more in this file "
            "(data.on_bad_record=skip; counted in summary.json's bad_records)"
        )


def _texts(col, label: str, field: str) -> list:
    import pyarrow as pa

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)):
        raise DataError(f"{label}: field {field!r} holds {col.type}, not text")
    try:
        return col.to_pylist()
    except UnicodeDecodeError:  # pyarrow's json reader passes invalid UTF-8 through: replace it (and count it)
        return [None if b is None else b.decode("utf-8", "replace") for b in col.cast(pa.large_binary()).to_pylist()]
