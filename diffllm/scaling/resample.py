"""Bootstrap over runs: each replicate redraws, size by size, the runs (seeds) of that size with replacement, so that
every size keeps its count of points and the interval measures the seed-to-seed spread the data shows, not a model of
it. Each series draws from its own generator, seeded from the config's seed and the series' name (a series' interval
does not depend on which other series the sweep holds); a comparison of two series draws once for both from the
pair's generator, and both take the same positions in their seed-sorted runs, so that with the same seeds the two
sides of every replicate are the same seeds (paired by seed)."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np


def generator(seed: int, name: str) -> np.random.Generator:
    """A generator for one series (or one pair 'a|b'), stable across processes and Python versions."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed), digest])


def strata(x: Sequence[float], seeds: Sequence) -> list[np.ndarray]:
    """Point indices per size (sizes increasing), each sorted by seed."""
    x = np.asarray(x, dtype=float)
    keys = [(s is None, s or 0) for s in seeds]
    return [np.array(sorted(np.flatnonzero(x == v), key=lambda i: keys[i]), dtype=int) for v in np.unique(x)]


def resamplable(groups: list[np.ndarray]) -> bool:
    """Some size has >= 2 runs to redraw (else every replicate is the data itself)."""
    return any(len(g) > 1 for g in groups)


def uniforms(rng: np.random.Generator, groups: list[list[np.ndarray]]) -> np.ndarray:
    """One replicate's draws for one or more series' strata: (sizes, most runs at a size) uniforms in [0, 1)."""
    return rng.random((max(len(g) for g in groups), max(len(s) for g in groups for s in g)))


def take(groups: list[np.ndarray], u: np.ndarray) -> np.ndarray:
    """The resampled point indices: at the j-th size, the runs at positions floor(u[j, :m] * m) (m: its runs)."""
    return np.concatenate([g[(u[j, : len(g)] * len(g)).astype(int)] for j, g in enumerate(groups)])
