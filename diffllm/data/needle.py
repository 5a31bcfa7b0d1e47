"""Synthetic key-value retrieval documents (Zoology's MQAR task, phrased like LWM's needles) as a training source.

A document is random filler words with N needles " magic <key> is <value> ." at random places, then Q queries that
repeat the phrase for needle keys ( " magic <key> is <value> ." ), so each query's value token can only be predicted
by retrieving its needle: many queries per document put the retrieval signal on ~10% of the tokens instead of 2 in
~170 (with one query, a pilot stayed at chance after 800 steps). Keys, values and filler come from disjoint lists of
common words (each one token in the BPE that `make train` trains on Shakespeare; any tokenizer works).

As a `data` source (mixable with text by weight):
    - name: needles
      format: needle
      path: "needle:n_needles=2-8,queries=16,filler=48,docs=100000"   # every key optional ("needle": defaults)
      weight: 0.1
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterator

import numpy as np

from ..errors import UserError
from .batch import Marked

KEYS = (
    "lark",
    "bear",
    "cat",
    "deer",
    "eagle",
    "fox",
    "raven",
    "ox",
    "lion",
    "ape",
    "boar",
    "ass",
    "fly",
    "seal",
    "bird",
    "wolf",
    "ant",
    "beast",
    "serpent",
    "dog",
    "sheep",
    "fish",
    "calf",
    "bull",
    "horse",
    "lamb",
    "bat",
    "cock",
    "worm",
    "crow",
    "dove",
    "goose",
)
VALUES = (
    "red",
    "blue",
    "green",
    "black",
    "white",
    "gold",
    "silver",
    "brown",
    "grey",
    "yellow",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "north",
    "south",
    "east",
    "west",
    "iron",
    "stone",
    "glass",
    "wood",
    "salt",
    "milk",
    "wine",
    "bread",
)
FILLER = (
    "the",
    "and",
    "of",
    "to",
    "in",
    "that",
    "with",
    "for",
    "not",
    "but",
    "this",
    "his",
    "all",
    "be",
    "have",
    "from",
    "by",
    "so",
    "what",
    "shall",
    "will",
    "no",
    "if",
    "my",
    "are",
    "our",
    "on",
    "at",
    "as",
    "more",
    "then",
    "when",
    "good",
    "now",
    "come",
    "let",
    "here",
    "there",
    "well",
    "may",
    "must",
    "make",
    "see",
    "know",
    "love",
    "time",
    "day",
    "night",
    "man",
    "world",
    "heart",
    "hand",
    "life",
    "death",
    "king",
    "lord",
    "old",
    "young",
    "sweet",
    "fair",
    "true",
    "great",
    "little",
    "long",
)
MARK, LINK, END = "magic", "is", "."


def needle_phrase(key: str, value: str) -> str:
    """The needle and the query: ' magic <key> is <value> .'"""
    return f" {MARK} {key} {LINK} {value} {END}"


@dataclass
class NeedleSpec:
    n_needles: tuple = (2, 8)  # drawn uniformly in [lo, hi] per document
    queries: int = 16
    filler: int = 48  # filler words per document
    docs: int = 100_000  # per file (a source has one file); a finite file lets validation streams end
    seed: int = 0

    @classmethod
    def parse(cls, path: str) -> NeedleSpec:
        """'needle' or 'needle:n_needles=2-8,queries=16,filler=48,docs=100000,seed=0'."""
        spec = set_fields(cls(), path, "needle", ("n_needles",))
        lo, hi = spec.n_needles
        if not 1 <= lo <= hi <= len(KEYS) or spec.queries < 1 or spec.filler < 0 or spec.docs < 1:
            raise UserError(f"path {path!r}: needs 1 <= n_needles <= {len(KEYS)}, queries >= 1, filler >= 0, docs >= 1")
        return spec

    def fingerprint(self) -> str:
        import hashlib
        import json

        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def set_fields(spec, path: str, head: str, ranges: tuple):
    """spec with the fields a synthetic source's path '<head>' or '<head>:key=value,...' sets: a key in `ranges`
    takes N or LO-HI (a (lo, hi) tuple), a str field its text, any other an int; a bad key or number is a ValueError
    naming the path."""
    name, _, rest = path.partition(":")
    names = [f.name for f in fields(spec)]
    if name != head:
        raise UserError(f"path {path!r}: a {head} source's path is '{head}' or '{head}:key=value,...'")
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in names:
            raise UserError(f"path {path!r}: unknown key {key!r} (keys: {', '.join(names)})")
        if isinstance(getattr(spec, key), str):
            setattr(spec, key, value)
            continue
        try:
            lo, _, hi = value.partition("-")
            setattr(spec, key, (int(lo), int(hi or lo)) if key in ranges else int(value))
        except ValueError:
            raise UserError(
                f"path {path!r}: {key}={value!r} is not a number ({', '.join(ranges)}: N or LO-HI)"
            ) from None
    return spec


def needle_document(rng: np.random.Generator, spec: NeedleSpec) -> Marked:
    """One training document: filler with needles at random word slots, then `queries` queries of needle keys. Only
    the queries' value words are marked as counting in the loss (data.loss_on=marked): everything else is random."""
    n = int(rng.integers(spec.n_needles[0], spec.n_needles[1] + 1))
    keys = rng.choice(len(KEYS), n, replace=False)
    values = rng.choice(len(VALUES), n, replace=True)
    words = [" " + FILLER[i] for i in rng.integers(0, len(FILLER), spec.filler)]
    for slot, k, v in sorted(zip(rng.integers(0, spec.filler + 1, n), keys, values), key=lambda t: -t[0]):
        words.insert(int(slot), needle_phrase(KEYS[k], VALUES[v]))
    parts = [("".join(words), False)]
    for a in rng.integers(0, n, spec.queries):  # " magic <key> is" | " <value>" (counts) | " ."
        parts += [(f" {MARK} {KEYS[keys[a]]} {LINK}", False), (f" {VALUES[values[a]]}", True), (f" {END}", False)]
    return Marked(parts)


def documents(spec: NeedleSpec, file: int, start: int, stride: int) -> Iterator[tuple[int, str, int]]:
    """(index, document, 0) for documents start, start+stride, ... of file `file`: document j of a file is the same
    whoever reads it (seeded by seed, file, j), which is what exact resume and stream sharding need."""
    for j in range(start, spec.docs, stride):
        yield j, needle_document(np.random.default_rng([spec.seed, file, j]), spec), 0
