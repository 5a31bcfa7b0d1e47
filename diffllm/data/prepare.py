"""Pre-tokenized sources: one numpy token file + index per source file, read back with the same document order,
sharding and state as the raw source (and the same fingerprint, so a run may switch between them and resume)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from . import workers as worker_procs
from .sources import Reader, Source, _semantic, _shard_path
from .tokenizer import Tokenizer

FORMAT = "diffllm-prepared-v1"


def _dtype(tok: Tokenizer) -> str:
    return "uint16" if tok.vocab_size <= 1 << 16 else "uint32"


def prepare_file(
    src: Source, tok: Tokenizer, folder: Path, f: int, skip_bad: bool = False, tokenize_chars: int = 1 << 20
) -> dict:
    """Tokenize file f of src into shard-<f>.bin (tokens, no EOS) and shard-<f>.idx.npy ((n_docs, 3) int64: end
    offset, undecodable chars, malformed records skipped before the example). Every example gets an index row, empty
    ones too, so example indices match the raw source's read with the same data.on_bad_record (`skip_bad`: skip)."""
    reader, dtype = Reader(src, skip_bad=skip_bad), _dtype(tok)
    ends, bads, skips, pending, chars, total = [], [], [], [], 0, 0
    stats = {"docs": 0, "empty": 0, "undecodable": 0, "tokens": 0, "bad_records": 0}
    tmp = _shard_path(folder, f, f"bin.tmp{os.getpid()}")
    with open(tmp, "wb") as out:

        def flush() -> None:
            nonlocal total
            texts = [d for _, d, _ in pending if d]
            ids = iter(tok.encode_batch(texts))
            for j, doc, bad in pending:
                toks = np.asarray(next(ids) if doc else [], dtype=dtype)
                out.write(toks.tobytes())
                total += len(toks)
                ends.append(total)
                bads.append(bad)
                skips.append(reader.skipped.pop((f, j), 0))
                stats["bad_records"] += skips[-1]
                stats["docs" if doc else "empty"] += 1
                stats["undecodable"] += bad
            pending.clear()

        for j, doc, bad in reader.docs(f, 0, 1):
            pending.append((j, doc, bad))
            chars += len(doc or "")
            if chars >= tokenize_chars:
                flush()
                chars = 0
        flush()
    stats["tokens"] = total
    np.save(_shard_path(folder, f, "idx.npy"), np.array([ends, bads, skips], dtype=np.int64).T.reshape(-1, 3))
    os.replace(tmp, _shard_path(folder, f, "bin"))
    return stats


def prepare_source(src: Source, tok: Tokenizer, out: Path, workers: int = 1, skip_bad: bool = False) -> dict:
    """All files of one source into out/<source name>/; meta.json is written last and marks the folder complete.
    skip_bad (data.on_bad_record=skip): malformed JSON lines are skipped and counted (meta's bad_records), and a run
    reading the folder counts them again, as it would reading the raw files."""
    folder = Path(out) / src.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    if workers > 1 and src.n_files > 1:
        with ProcessPoolExecutor(min(workers, src.n_files), mp_context=worker_procs.context()) as pool:
            args = [(src, tok, folder, f, skip_bad) for f in range(src.n_files)]
            parts = list(pool.map(prepare_file, *zip(*args)))
    else:
        parts = [prepare_file(src, tok, folder, f, skip_bad) for f in range(src.n_files)]
    totals = {k: sum(p[k] for p in parts) for k in parts[0]}
    root = os.path.commonpath([os.path.dirname(p) for p in src.files]) if src.kind != "hub" else ""
    meta = {
        "format": FORMAT,
        "source": json.loads(json.dumps(_semantic(src.cfg))),
        "fingerprint": src.fingerprint,
        "files": [os.path.relpath(p, root) if root else p for p in src.files],
        "tokenizer": tok.fingerprint,
        "dtype": _dtype(tok),
        **totals,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta
