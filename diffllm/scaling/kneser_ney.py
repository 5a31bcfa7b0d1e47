"""Interpolated Kneser-Ney n-gram language model (plain KN: one discount per order, not modified KN's three), numpy
only, float64, for the reference baselines (diffllm/scaling/baselines.py). Chen & Goodman (1999), eq. for
interpolated KN, with the discount of Ney et al. D_k = n1 / (n1 + 2 n2) (n1, n2: k-grams counted once, twice):

    p_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h .)  +  D_k T_k(h) / c_k(h .) * p_{k-1}(w | h')      (c_k(h .) > 0)
               = p_{k-1}(w | h')                                                                  (h never seen)
    p_0(w)     = 1 / V

h' is h without its first token; c_k(h .) = sum_w c_k(h w); T_k(h) = the number of distinct w with c_k(h w) > 0. At
the highest order c_k is the count; below it the continuation count N1+(. h w): the number of distinct tokens seen
before h w. n-grams are counted inside each training window (none spans two windows); a target whose window offers
fewer than n - 1 tokens of context is scored by the highest order its context allows (as the model sees it)."""

from __future__ import annotations

import numpy as np

from ..errors import UserError


def kgram_keys(windows: np.ndarray, k: int, vocab: int) -> np.ndarray:
    """Every k-gram inside the (n, L) windows as one int64 key, base `vocab` (first token most significant)."""
    L = windows.shape[1]
    key = np.zeros((windows.shape[0], max(L - k + 1, 0)), dtype=np.int64)
    for j in range(k):
        key = key * vocab + windows[:, j : L - k + 1 + j]
    return key.ravel()


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[keys == query] per query (keys sorted), 0 where absent."""
    if not len(keys):
        return np.zeros(len(query))
    at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[at] == query, values[at], 0).astype(np.float64)


class KneserNey:
    def __init__(self, train: np.ndarray, order: int, vocab: int):
        if vocab**order >= 2**63:
            raise UserError(f"a {order}-gram baseline over a vocabulary of {vocab:,} needs keys beyond 64 bits")
        train = np.asarray(train, dtype=np.int64)
        self.order, self.vocab = order, vocab
        self.levels = []  # per order k = 1..order: (gram keys, counts, context keys, context totals, types, D)
        for k in range(1, order + 1):
            if k == order:
                keys, counts = np.unique(kgram_keys(train, k, vocab), return_counts=True)
            else:  # continuation counts: distinct (k+1)-grams, by their last k tokens
                longer = np.unique(kgram_keys(train, k + 1, vocab))
                keys, counts = np.unique(longer % vocab**k, return_counts=True)
            ctx, inverse = np.unique(keys // vocab, return_inverse=True)
            totals = np.bincount(inverse, weights=counts, minlength=len(ctx))
            types = np.bincount(inverse, minlength=len(ctx)).astype(np.float64)
            n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
            discount = n1 / (n1 + 2 * n2) if n1 else 0.5
            self.levels.append((keys, counts.astype(np.float64), ctx, totals, types, discount))

    def prob(self, context: np.ndarray, target: np.ndarray, available: np.ndarray) -> np.ndarray:
        """p(target | context): context (m, order - 1) tokens (the last column nearest the target), available (m,)
        how many of them exist (the rest are padding). Float64, (m,)."""
        p = np.full(len(target), 1.0 / self.vocab)
        for k, (keys, counts, ctx, totals, types, d) in enumerate(self.levels, start=1):
            h = np.zeros(len(target), dtype=np.int64)
            for j in range(self.order - k, self.order - 1):  # the last k - 1 context tokens
                h = h * self.vocab + context[:, j]
            c_h = _lookup(ctx, totals, h)
            use = (available >= k - 1) & (c_h > 0)
            c_hw = _lookup(keys, counts, h * self.vocab + target)
            t_h = _lookup(ctx, types, h)
            with np.errstate(divide="ignore", invalid="ignore"):
                p = np.where(use, (np.maximum(c_hw - d, 0) + d * t_h * p) / c_h, p)
        return p

    def cross_entropy(self, windows: np.ndarray) -> float:
        """Mean -log p over the targets w[1:] of each (m, T+1) window, each after the tokens before it."""
        windows = np.asarray(windows, dtype=np.int64)
        m, L = windows.shape
        n = self.order - 1
        padded = np.concatenate([np.zeros((m, n), dtype=np.int64), windows], axis=1)
        total = 0.0
        for t in range(1, L):  # target position t: its context is windows[:, t - n : t], padded where t < n
            p = self.prob(padded[:, t : t + n], windows[:, t], np.full(m, t))
            total += float(-np.log(p).sum())
        return total / (m * (L - 1))
