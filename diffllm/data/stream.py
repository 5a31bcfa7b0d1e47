"""Stream: one independent packed token stream over all sources; each window comes from one source, drawn by weight
from a seeded counter-based generator (window n of stream s always draws the same source)."""

from __future__ import annotations

import hashlib
import json
from typing import Optional

import numpy as np

from .config import DataConfig, DataError
from .packing import Packer, assign_items
from .sources import Reader, Source
from .tokenizer import Tokenizer

DRAW_BLOCK = 4096  # mixture draws are generated in seeded blocks of this many windows


def data_fingerprint(sources: list[Source], tok: Tokenizer, split: str = "") -> str:
    """Changes when any source's files, reading settings or names change, the tokenizer does, or the held-out split."""
    key = json.dumps([[s.name, s.fingerprint] for s in sources] + [tok.fingerprint] + ([split] if split else []))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _stable_int(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


class Stream:
    """Windows of seq_len+1 tokens from stream `index` of `n_streams` (a stream reads its share of every source).
    part: "train" or "val"; it matters only when cfg.holds_out (validation is a hashed share of the training
    documents): "train" skips those documents, "val" reads only them."""

    def __init__(
        self,
        sources: list[Source],
        tok: Tokenizer,
        cfg: DataConfig,
        index: int,
        n_streams: int,
        state: Optional[dict] = None,
        shuffle: Optional[bool] = None,
        epochs: Optional[int] = None,
        part: str = "train",
    ):
        self.index, self.seed = index, cfg.seed
        shuffle = cfg.shuffle_files if shuffle is None else shuffle
        saved = (state or {}).get("sources", {})
        unknown = sorted(set(saved) - {s.name for s in sources})
        if unknown:
            raise DataError(
                f"data state: source {unknown[0]!r} is not in data.sources; the state belongs to another data config"
            )
        self.packers = [
            Packer(
                src,
                Reader(src, tok.fingerprint, skip_bad=cfg.on_bad_record == "skip"),
                tok,
                cfg.seq_len + 1,
                assign_items(src.n_files, n_streams, index),
                [cfg.seed, _stable_int(src.name), index] if shuffle else None,
                epochs,
                cfg.tokenize_chars,
                saved.get(src.name),
                (cfg.val_fraction, part == "val") if cfg.holds_out else None,
            )
            for src in sources
        ]
        self.windows = (state or {}).get("windows", 0)
        weights = np.array([s.cfg.weight for s in sources], dtype=np.float64)
        self._cum = np.cumsum(weights / weights.sum())
        self._block, self._draws = -1, None

    def _pick(self, n: int) -> int:
        if len(self.packers) == 1:
            return 0
        if n // DRAW_BLOCK != self._block:
            self._block = n // DRAW_BLOCK
            self._draws = np.random.default_rng([self.seed, 7, self.index, self._block]).random(DRAW_BLOCK)
        return min(int(np.searchsorted(self._cum, self._draws[n % DRAW_BLOCK], side="right")), len(self.packers) - 1)

    def next_epoch(self) -> int:
        """The pass over its source (0: the first) in which the next window starts."""
        return self.packers[self._pick(self.windows)].state()["epoch"]

    def next_window(self) -> np.ndarray:
        window = self.packers[self._pick(self.windows)].next_window()
        self.windows += 1
        return window

    def state(self) -> dict:
        return {"windows": self.windows, "sources": {p.src.name: p.state() for p in self.packers}}
