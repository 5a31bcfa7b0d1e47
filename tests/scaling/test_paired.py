"""Statistics that respect the design (issue 55 §4), on synthetic losses from known laws with seed noise that moves
both archs together (the same seed: the same data order and init stream): the paired gap's 90% interval covers the
true gap in ~90% of many synthetic replicates and is narrower than the unpaired one; the L(N, D) replicates of
paired_joint redraw the same seeds for both series; the effective compute multiplier matches its closed form; a fit
that is not identified is refused its gap in one line."""

from __future__ import annotations

import numpy as np
import pytest

from diffllm.scaling import paired, predict
from diffllm.scaling.fit import Interval, JointLaw, bootstrap_joint, interval, not_identified, paired_joint
from diffllm.scaling.optimal import FlopsPerToken, compute_multiplier
from diffllm.scaling.paired import mean_interval, paired_gap, t_quantile, welch_interval
from tests.scaling.synthetic import DOC_LAWS

LAWS = {a: JointLaw(*p) for a, p in DOC_LAWS.items()}


def test_t_quantiles_match_the_published_table():
    # two-sided 90% (one-sided 0.95) and 95% points of Student's t, from any statistics table
    for df, t90, t95 in ((1, 6.3138, 12.7062), (2, 2.9200, 4.3027), (4, 2.1318, 2.7764), (9, 1.8331, 2.2622),
                         (30, 1.6973, 2.0423)):  # fmt: skip
        assert t_quantile(0.90, df) == pytest.approx(t90, abs=1e-4)
        assert t_quantile(0.95, df) == pytest.approx(t95, abs=1e-4)


def _seed_losses(rng, reps: int, seeds: int, shared: float, own: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(reps, seeds) final losses of two archs at one (N, D) from the known laws: each seed adds a shift common to
    both archs (sd `shared`) and one of each arch's own (sd `own`); returns them and the true gap."""
    n, d = 2e5, 4e6
    common = rng.normal(0, shared, (reps, seeds))
    t = float(LAWS["transformer"](n, d)) + common + rng.normal(0, own, (reps, seeds))
    a = float(LAWS["diff"](n, d)) + common + rng.normal(0, own, (reps, seeds))
    return a, t, float(LAWS["diff"](n, d) - LAWS["transformer"](n, d))


def test_paired_interval_covers_at_its_level_and_is_narrower_than_unpaired():
    rng = np.random.default_rng(0)
    a, t, truth = _seed_losses(rng, 3000, 5, shared=0.02, own=0.01)  # r = 0.8 between the archs over seeds
    got = [paired_gap(dict(enumerate(x)), dict(enumerate(y)), 0.9) for x, y in zip(a, t)]
    paired = np.array([(g["paired"].low <= truth <= g["paired"].high) for g in got])
    unpaired = np.array([(g["unpaired"].low <= truth <= g["unpaired"].high) for g in got])
    width = np.array([(g["paired"].high - g["paired"].low) / (g["unpaired"].high - g["unpaired"].low) for g in got])
    assert 0.875 <= paired.mean() <= 0.925, paired.mean()  # 3000 replicates: binomial sd 0.0055
    assert unpaired.mean() > 0.97  # the unpaired interval spends the shared seed noise twice
    assert np.median(width) < 0.6 and np.median([g["r"] for g in got]) > 0.5
    # without a shared part the two are alike (the pairing costs little when seeds do not correlate)
    a, t, truth = _seed_losses(rng, 1000, 5, shared=0.0, own=0.01)
    cover = np.mean([mean_interval(x - y, 0.9).low <= truth <= mean_interval(x - y, 0.9).high for x, y in zip(a, t)])
    assert 0.86 <= cover <= 0.94
    assert welch_interval(a[0], t[0], 0.9).value == pytest.approx(a[0].mean() - t[0].mean(), abs=1e-15)


def _sweep(rng, seeds=(1, 2, 3, 4, 5, 6), shared=0.03, own=0.0):
    """Final points of both archs at 4 sizes x 3 budgets: each (size, seed) family shifted by one draw common to
    both archs (its budgets share the stable run), plus each arch's own noise."""
    sizes, budgets = (5e4, 1e5, 2e5, 4e5), (1e6, 2e6, 4e6)
    shift = {(n, s): rng.normal(0, shared) for n in sizes for s in seeds}
    out = {}
    for arch, law in LAWS.items():
        pts = [(n, d, float(law(n, d)) + shift[n, s] + rng.normal(0, own), s) for n in sizes for d in budgets
               for s in seeds]  # fmt: skip
        out[arch] = tuple(list(v) for v in zip(*pts))
    return out


def test_paired_joint_redraws_the_same_seeds_for_both_series():
    """With seed noise common to both archs the paired replicates' gap interval is far narrower than that of the two
    series' independent replicates, and covers the true gap at the largest size; each replicate holds the same
    seeds, budgets and sizes in both series."""
    data = _sweep(np.random.default_rng(1))
    t, a = paired_joint(data["transformer"], data["diff"], 30, np.random.default_rng(2))
    n, d = 4e5, 4e6
    truth = float(LAWS["diff"](n, d) - LAWS["transformer"](n, d))
    paired = interval(truth, [float(y(n, d) - x(n, d)) for x, y in zip(t, a)], 0.9)
    own = {k: bootstrap_joint(*v[:3], 30, np.random.default_rng(i))[1] for i, (k, v) in enumerate(data.items())}
    unpaired = interval(truth, [float(y(n, d) - x(n, d)) for x, y in zip(own["transformer"], own["diff"])], 0.9)
    assert paired.low <= truth <= paired.high
    assert paired.high - paired.low < 0.3 * (unpaired.high - unpaired.low), (paired, unpaired)
    # one series with a single seed per size: nothing to redraw anywhere -> None
    one = {k: tuple(list(x) for x in zip(*[p for p in zip(*v) if p[3] == 1])) for k, v in data.items()}
    assert paired_joint(one["transformer"], one["diff"], 5, np.random.default_rng(0)) is None


def test_effective_compute_multiplier_is_the_token_factor_of_a_law_that_sees_k_times_the_data():
    """L_a(N, D) = L_b(N, k D) with the same FLOPs per token: a reaches any loss with 1/k of b's compute, so its
    multiplier is k (B_a = B_b k^-beta)."""
    b = LAWS["transformer"]
    f = FlopsPerToken.fit([5e4, 1e5, 2e5, 4e5], [6 * 5e4, 6 * 1e5, 6 * 2e5, 6 * 4e5])
    for k in (0.5, 1.0, 1.7, 3.0):
        a = JointLaw(b.E, b.A, b.alpha, b.B * k**-b.beta, b.beta)
        assert compute_multiplier(b, f, a, f, 6 * 4e5 * 4e6) == pytest.approx(k, rel=2e-3)


def test_a_fit_that_is_not_identified_is_refused_its_gap():
    law = LAWS["diff"]
    fine = {"alpha": Interval(0.3, 0.2, 0.5, 10, 10), "beta": Interval(0.4, 0.3, 0.6, 10, 10)}
    wide = {**fine, "alpha": Interval(0.3, 0.03, 2.08, 10, 10)}
    assert not_identified(law, fine) == []
    assert not_identified(law, wide) == ["alpha [0.03, 2.08] spans 69x"]
    assert not_identified(JointLaw(0.0, *DOC_LAWS["diff"][1:]), fine) == ["E=0"]
    boot = {a: [law] * 5 for a, law in LAWS.items()}
    why = {"transformer": [], "diff": not_identified(LAWS["diff"], wide)}
    rows = predict.predictions("micro-4@4M", "block", LAWS, boot, "transformer", 0.9, {}, why)
    diff = next(w for w in rows if w["series"] == "diff")
    assert "gap" not in diff and diff["refused"] == "diff: alpha [0.03, 2.08] spans 69x"
    md = predict.markdown("micro-4@4M", rows, 0.9)
    assert any(line.startswith("| diff |") and "| refused: not identified |" in line for line in md)
    assert "diff: gap refused: no gap is reported; not identified (diff: alpha [0.03, 2.08] spans 69x)" in md
    kept = predict.predictions("micro-4@4M", "block", LAWS, boot, "transformer", 0.9, {}, why, refuse=False)
    diff = next(w for w in kept if w["series"] == "diff")
    assert diff["gap"] == pytest.approx(
        float(LAWS["diff"](diff["N"], 4e6))
        - float(LAWS["transformer"](next(w["N"] for w in kept if w["series"] == "transformer"), 4e6)),
        abs=1e-12,
    )
    assert diff["unidentified"] == "diff: alpha [0.03, 2.08] spans 69x"


def test_few_seeds_are_said_to_understate_the_spread():
    """A bootstrap of k seeds has (k - 1)/k of their variance: below 5 seeds at some size, fits.md says so."""
    two = ([1e5, 1e5, 2e5, 2e5], [1e6] * 4, [3.0] * 4, [1, 2, 1, 2])
    five = ([1e5] * 5 + [2e5] * 5, [1e6] * 10, [3.0] * 10, [1, 2, 3, 4, 5] * 2)
    assert "redraw 2 seed(s) at some size" in paired._few_seeds_note([two, five])[0]
    assert "= 0.50 of their variance" in paired._few_seeds_note([two])[0]
    assert paired._few_seeds_note([five]) == []
