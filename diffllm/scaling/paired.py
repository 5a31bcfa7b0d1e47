"""Statistics that respect the design of a sweep: the same seed is the same data order and init stream in every arch,
so a gap between two archs is measured seed by seed (paired), never as the difference of two independent means.

    measured gap   g = mean over shared seeds s of (L_a(s) - L_b(s)), with the Student t interval
                   g ± t_{(1+level)/2, k-1} · sd(d) / sqrt(k) on the k per-seed differences d (exact for normal d;
                   a percentile bootstrap of 5 seeds would cover about 80% where it claims 90%)
    unpaired gap   the same g with Welch's interval (the two archs' seeds as independent samples): what the
                   pairing saves, shown beside it
    skill          1 - |forecast error of the fit| / |forecast error of a naive forecast| (1: exact; 0: no better
                   than the naive forecast; < 0: worse)

Fit-derived gaps (a prediction, the effective compute multiplier) come from replicates that redraw seeds once for
both archs (fit.py paired_joint)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .fit import Interval, not_identified, paired_joint
from .resample import generator


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df (Abramowitz & Stegun 26.7.3-4, exact finite series)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + 2·4/(3·5) cos^4 + ... up to cos^(df-3)))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1·3/(2·4) cos^4 + ... up to cos^(df-2))
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| < t) = level (the two-sided interval's half width in standard errors), by bisection."""
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < level:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def seed_differences(a: dict, b: dict) -> np.ndarray:
    """a[s] - b[s] over the seeds both hold, in seed order."""
    return np.array([a[s] - b[s] for s in sorted(set(a) & set(b))], dtype=float)


def mean_interval(d: np.ndarray, level: float) -> Interval:
    """The mean of d with its Student t interval (no interval from fewer than 2 values)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return Interval(float(d.mean()) if len(d) else float("nan"), float("nan"), float("nan"), 0, len(d))
    half = t_quantile(level, len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return Interval(float(d.mean()), float(d.mean()) - half, float(d.mean()) + half, len(d), len(d))


def welch_interval(a: np.ndarray, b: np.ndarray, level: float) -> Interval:
    """mean(a) - mean(b) with Welch's interval (a and b independent samples; df by Welch-Satterthwaite, rounded
    down)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = max(int((va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))), 1) if va + vb > 0 else 1
    g, half = float(a.mean() - b.mean()), t_quantile(level, df) * math.sqrt(va + vb)
    return Interval(g, g - half, g + half, len(a) + len(b), len(a) + len(b))


def paired_gap(a: dict, b: dict, level: float) -> Optional[dict]:
    """The measured gap a - b over the seeds both hold (seed -> loss dicts): paired and unpaired intervals, the seed
    count, how many seeds have a below b, and the correlation of the two archs over seeds; None without 2 shared
    seeds."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    xa, xb = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    r = float(np.corrcoef(xa, xb)[0, 1]) if xa.std() > 0 and xb.std() > 0 else float("nan")
    return {
        "paired": mean_interval(xa - xb, level),
        "unpaired": welch_interval(xa, xb, level),
        "seeds": len(seeds),
        "ahead": int((xa < xb).sum()),
        "r": r,
    }


def skill(err_fit: float, err_naive: float) -> Optional[float]:
    """1 - |err_fit| / |err_naive|; None when the naive forecast is exact (no scale to score against)."""
    return None if err_naive == 0 else 1 - abs(err_fit) / abs(err_naive)


def paired_fits(
    points: dict, joint: dict, intervals: dict, exact: set, base: Optional[str], reps: int, seed: int
) -> tuple[dict, dict, list[str]]:
    """For `scaling fit`: each series' paired L(N, D) replicates against `base` (series -> (base's, its); from one
    draw of seeds per replicate, max(reps // 4, 20) of them, from the pair's own generator; none for an exactly
    determined fit or where nothing can be redrawn), why each fit is not identified (series -> reasons; intervals:
    series -> its parameters' Intervals) and notes."""
    pairs = {}
    for a in joint:
        if a != base and base in joint and not {a, base} & exact:
            got = paired_joint(points[base], points[a], max(reps // 4, 20), generator(seed, f"{a}|seeds"))
            if got is not None:
                pairs[a] = got
    why = {a: not_identified(joint[a], intervals[a]) for a in joint}
    return pairs, why, _few_seeds_note([points[a] for a in [base, *pairs]] if pairs else [])


def _few_seeds_note(points: list[tuple]) -> list[str]:
    """Paired replicates that redraw k < 5 seeds at some size understate the seed spread: a bootstrap of k values has
    (k - 1)/k of their variance (half at k = 2)."""
    k = min((len({s for m, s in zip(n, seeds) if m == v}) for n, _, _, seeds in points for v in set(n)), default=5)
    if k >= 5:
        return []
    return [
        f"paired gap replicates redraw {k} seed(s) at some size: a bootstrap of k seeds gives (k - 1)/k = "
        f"{(k - 1) / k:.2f} of their variance, so the gap and multiplier intervals are too narrow: add seeds"
    ]
