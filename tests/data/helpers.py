"""Helpers for the data tests: small corpora written to disk, configs, and reading streams to the end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from diffllm.config import build
from diffllm.data import DataConfig
from diffllm.data.loader import resolve_sources
from diffllm.data.stream import Stream

WORDS = "the king of love and death my lord good sir what is thy name speak now o cruel fate".split()


def make_docs(tag: str, n: int, seed: int, max_words: int = 60) -> list[str]:
    """n distinct documents of 1..max_words words (each starts with its own id, so all are unique)."""
    rng = random.Random(seed)
    return [f"{tag}-{j} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))) for j in range(n)]


def write_jsonl(path: Path, texts: list, field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({field: t, "id": len(t or "")}) + "\n")
    return path


def corpus(folder: Path, n_files: int, docs_per_file: int, tag: str = "d", seed: int = 0) -> list[str]:
    """n_files jsonl files under folder; returns every document in file order."""
    docs = []
    for f in range(n_files):
        texts = make_docs(f"{tag}{f}", docs_per_file, seed * 1000 + f)
        write_jsonl(Path(folder) / f"part-{f:02d}.jsonl", texts)
        docs += texts
    return docs


def cfg(sources: list, **kw) -> DataConfig:
    node = {"name": "test", "seq_len": 31, "num_workers": 0, "sources": sources, **kw}
    return build(DataConfig, node, "data")


def take(loader, n: int) -> list[torch.Tensor]:
    return [next(loader).tokens for _ in range(n)]


def drain(data: DataConfig, tok, stream: int, n_streams: int, part: str = "train") -> np.ndarray:
    """Every token stream `stream` yields in one epoch: its full windows, then the unpacked tail."""
    s = Stream(resolve_sources(data, val=part == "val"), tok, data, stream, n_streams, epochs=1, part=part)
    windows = []
    while True:
        try:
            windows.append(s.next_window()[0])  # the tokens row
        except StopIteration:
            break
    assert all(len(w) == data.seq_len + 1 for w in windows)
    return np.concatenate(windows + [p.tail() for p in s.packers])


def split_docs(tokens: np.ndarray, tok) -> list[str]:
    """Decode an EOS-separated token sequence back into its documents (each must end with EOS)."""
    ends = np.flatnonzero(tokens == tok.eos_id)
    assert len(tokens) == 0 or ends[-1] == len(tokens) - 1, "a document is cut off (no EOS at the end)"
    docs, start = [], 0
    for e in ends:
        docs.append(tok.decode(tokens[start:e].tolist()))
        start = e + 1
    return docs
