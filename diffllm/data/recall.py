"""Synthetic associative recall (Zoology's MQAR): N key-value pairs, filler, then every key queried once.

A document of `length` words (one token each in the BPEs diffllm trains: `make train`'s Shakespeare BPE and
`data=recall`'s own; any tokenizer works, a word of several tokens is an answer of several tokens):

    <pad filler> k_1 v_1 k_2 v_2 ... k_N v_N <gap filler words> k_a1 [v_a1] k_a2 [v_a2] ... k_aN [v_aN]

pad = length - 4N - gap filler words first (so `length` changes the context without moving the queries), the pairs,
`gap` filler words, then the N keys in a random order each followed by its value. Only the bracketed query values
are marked (a `Marked` document: they alone count in the loss with data.loss_on=marked, as in MQAR where every other
label is -100). Query j (0-based) of the key at pair i (0-based) is 2(N - i) + gap + 2j words after that key, so the
mean distance is 2N + gap. Keys, values and filler are disjoint word lists (needle.py's: 32 keys, 32 values, 64
filler words); keys and values are unique within a document (MQAR's split of the vocabulary into key and value ids).
The unmarked context is segmented too (the pad, each pair " k v", the gap: every segment starts at a word boundary,
so the packer's tokens are those of the whole text), which lets eval find each pair's tokens (eval/recall.py).

Words, not reserved token ids: the packer tokenizes text documents, so a text task needs no new path through it and
reads the same through any tokenizer; the words are single tokens in the BPEs diffllm trains (tested).

Split: a document's binding set {k_i -> v_i} decides its split: `heldout(keys, values)` (a hash, 1/8 of binding
sets) is true for split=test documents and false for split=train ones (a draw of the wrong split is redrawn), so no
training document can equal a held-out one, and the splits draw from seed streams of their own.

As a `data` source:
    - name: recall
      format: recall
      path: "recall:pairs=2-8,length=64,gap=0-16,docs=100000,seed=0,split=train"   # every key optional
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from ..errors import UserError
from .batch import Marked
from .needle import FILLER, KEYS, VALUES, set_fields

SPLITS = ("train", "test")
HELDOUT_EVERY = 8  # 1 in 8 binding sets is held out


def heldout(keys: list[str], values: list[str]) -> bool:
    """Whether the binding set {key -> value} belongs to the held-out split (order-free: a hash of the sorted pairs)."""
    text = ",".join(sorted(f"{k}={v}" for k, v in zip(keys, values)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % HELDOUT_EVERY == 0


@dataclass
class RecallSpec:
    pairs: tuple = (2, 8)  # N, drawn uniformly in [lo, hi] per document
    length: int = 64  # words per document
    gap: tuple = (0, 16)  # filler words between the pairs and the queries, drawn uniformly in [lo, hi]
    docs: int = 100_000  # per file (a source has one file); a finite file lets validation streams end
    seed: int = 0
    split: str = "train"  # train | test (held-out binding sets)

    @classmethod
    def parse(cls, path: str) -> RecallSpec:
        """'recall' or 'recall:pairs=2-8,length=64,gap=0-16,docs=100000,seed=0,split=train'."""
        spec = set_fields(cls(), path, "recall", ("pairs", "gap"))
        try:
            check(spec.pairs[1], spec.gap[1], spec.length, spec.split)
        except ValueError as e:
            raise UserError(f"path {path!r}: {e}") from None
        if not 1 <= spec.pairs[0] <= spec.pairs[1] or not 0 <= spec.gap[0] <= spec.gap[1] or spec.docs < 1:
            raise UserError(f"path {path!r}: needs 1 <= pairs LO <= HI, 0 <= gap LO <= HI, docs >= 1")
        return spec

    def fingerprint(self) -> str:
        return spec_fingerprint(self)


def spec_fingerprint(spec) -> str:
    """A synthetic split task's spec (recall.py's, icl.py's) as the 16 hex digits its source fingerprint holds."""
    return hashlib.sha256(repr(sorted(asdict(spec).items())).encode()).hexdigest()[:16]


def seeded(spec, file: int, start: int, stride: int) -> Iterator[tuple[int, np.random.Generator]]:
    """(j, the generator of document j) for j = start, start+stride, ... < spec.docs: seeded by (seed, split, file, j)
    alone, whoever reads it (exact resume and stream sharding; each split a stream of its own)."""
    for j in range(start, spec.docs, stride):
        yield j, np.random.default_rng([spec.seed, SPLITS.index(spec.split), file, j])


def check(n: int, gap: int, length: int, split: str) -> None:
    """ValueError unless N pairs, `gap` and N queries fit `length` words and the split is known."""
    if not 1 <= n <= min(len(KEYS), len(VALUES)):
        raise UserError(f"pairs={n}: must be in 1..{min(len(KEYS), len(VALUES))}")
    if gap < 0 or 4 * n + gap > length:
        raise UserError(f"length={length}: cannot hold {n} pairs, {n} queries and gap={gap} (needs 4N + gap words)")
    if split not in SPLITS:
        raise UserError(f"split={split!r}: expected one of {SPLITS}")


def recall_document(rng: np.random.Generator, n: int, gap: int, length: int, split: str) -> Marked:
    """One document of the layout above, its binding set drawn (and redrawn) until it belongs to `split`."""
    while True:
        keys = [KEYS[i] for i in rng.choice(len(KEYS), n, replace=False)]
        values = [VALUES[i] for i in rng.choice(len(VALUES), n, replace=False)]
        if heldout(keys, values) == (split == "test"):
            break
    filler = [FILLER[i] for i in rng.integers(0, len(FILLER), length - 4 * n)]
    pad, between = filler[: length - 4 * n - gap], filler[length - 4 * n - gap :]
    context = [pad] + [[k, v] for k, v in zip(keys, values)] + [between]  # segments: pad | " k v" each | gap
    parts = [("".join(" " + w for w in words), False) for words in context if words]
    for a in rng.permutation(n):  # " k" | " v" (counts)
        parts += [(f" {keys[a]}", False), (f" {values[a]}", True)]
    return Marked(parts)


def documents(spec: RecallSpec, file: int, start: int, stride: int) -> Iterator[tuple[int, str, int]]:
    """(index, document, 0) for documents start, start+stride, ... of file `file` (`seeded`)."""
    for j, rng in seeded(spec, file, start, stride):
        n = int(rng.integers(spec.pairs[0], spec.pairs[1] + 1))
        gap = int(rng.integers(spec.gap[0], spec.gap[1] + 1))
        yield j, recall_document(rng, n, gap, spec.length, spec.split), 0
