"""The Kneser-Ney baselines (diffllm/scaling/kneser_ney.py) against a hand computation, a plain-Python count of the
same formulas, and normalisation: every context's distribution sums to 1 in float64."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from diffllm.scaling.kneser_ney import KneserNey


def test_bigram_probabilities_equal_a_hand_computation():
    # corpus 0 1 0 1 2, V = 3. Bigram counts (0,1):2 (1,0):1 (1,2):1 -> n1 = 2, n2 = 1, D2 = 2 / (2 + 2) = 0.5.
    # Continuation counts N1+(. w) = 1 for each of 0, 1, 2 -> D1 = 3 / 3 = 1, p1(w) = 0 + 1 * 3/3 * 1/3 = 1/3.
    kn = KneserNey(np.array([[0, 1, 0, 1, 2]]), 2, 3)
    p = kn.prob(np.array([[0], [1], [2]]), np.array([1, 0, 2]), np.array([1, 1, 1]))
    assert p[0] == pytest.approx((2 - 0.5) / 2 + 0.5 * 1 / 2 * (1 / 3), abs=1e-15)  # p(1|0) = 0.8333
    assert p[1] == pytest.approx((1 - 0.5) / 2 + 0.5 * 2 / 2 * (1 / 3), abs=1e-15)  # p(0|1) = 0.4167
    assert p[2] == pytest.approx(1 / 3, abs=1e-15)  # context 2 never seen: the unigram
    assert kn.prob(np.array([[0]]), np.array([1]), np.array([0]))[0] == pytest.approx(1 / 3)  # no context yet


def reference(train: list[list[int]], order: int, vocab: int):
    """The same formulas with Counters, one probability at a time."""
    grams = [Counter() for _ in range(order + 1)]
    for w in train:
        for k in range(1, order + 1):
            for i in range(len(w) - k + 1):
                grams[k][tuple(w[i : i + k])] += 1
    counts = {order: grams[order]}
    for k in range(1, order):
        counts[k] = Counter(g[1:] for g in grams[k + 1])  # distinct left extensions
    tables = {}
    for k, c in counts.items():
        tot, types = defaultdict(float), defaultdict(int)
        for g, n in c.items():
            tot[g[:-1]] += n
            types[g[:-1]] += 1
        n1, n2 = sum(v == 1 for v in c.values()), sum(v == 2 for v in c.values())
        tables[k] = (c, tot, types, n1 / (n1 + 2 * n2) if n1 else 0.5)

    def p(h: tuple, w: int) -> float:
        q = 1 / vocab
        for k in range(1, order + 1):
            if len(h) < k - 1:
                break
            c, tot, types, d = tables[k]
            hk = h[len(h) - (k - 1) :] if k > 1 else ()
            if tot.get(hk, 0) > 0:
                q = (max(c.get(hk + (w,), 0) - d, 0) + d * types[hk] * q) / tot[hk]
        return q

    return p


@pytest.mark.parametrize("order", [3, 4])
def test_matches_plain_counting_and_every_context_sums_to_one(order):
    rng = np.random.default_rng(0)
    vocab = 7
    train = rng.integers(0, vocab, size=(6, 30)) * (rng.random((6, 30)) < 0.8)  # skewed: many zeros
    val = rng.integers(0, vocab, size=(3, 12))
    kn, ref = KneserNey(train, order, vocab), reference(train.tolist(), order, vocab)
    want = [-math.log(ref(tuple(w[max(0, t - order + 1) : t]), w[t])) for w in val.tolist() for t in range(1, 12)]
    assert kn.cross_entropy(val) == pytest.approx(sum(want) / len(want), rel=1e-12)
    n = order - 1
    contexts = [train[0, :n], train[1, 3 : 3 + n], np.array([6] * n)]  # seen, seen, unseen
    for h in contexts:
        ctx = np.repeat(h[None, :], vocab, axis=0)
        total = kn.prob(ctx, np.arange(vocab), np.full(vocab, n)).sum()
        assert abs(total - 1.0) < 1e-12
    for avail in range(n):  # shorter contexts (a window's first targets) are distributions too
        ctx = np.repeat(train[0, :n][None, :], vocab, axis=0)
        assert abs(kn.prob(ctx, np.arange(vocab), np.full(vocab, avail)).sum() - 1.0) < 1e-12


def test_baselines_carry_the_kneser_ney_columns_of_the_same_windows():
    from diffllm.scaling.baselines import cross_entropies

    rng = np.random.default_rng(1)
    train, val = rng.integers(0, 20, (30, 9)), rng.integers(0, 20, (5, 9))
    b = cross_entropies(train, val, 20)
    for order, got in ((3, b.kn3), (4, b.kn4)):
        ref = reference(train.tolist(), order, 20)
        want = [-math.log(ref(tuple(w[max(0, t - order + 1) : t]), w[t])) for w in val.tolist() for t in range(1, 9)]
        assert got == pytest.approx(sum(want) / len(want), rel=1e-12)
