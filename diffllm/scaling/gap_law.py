"""The gap law (issue 55 §5): the gap between an arch and the baseline fitted directly, seed by seed, for a prediction
where each arch's own L(N, D) is not identified (its five parameters from a short ladder with seed noise) but the gap,
which the shared seeds move together, is.

    cells        (size, k-th budget of that size): the same grid point of both series, paired by seed
    the law      g(N, D) = a + b·log2 N + c·log2 D at the baseline's N and D of each cell; on a ladder of one
                 budget (every cell at one D), g(N) = a + b·log2 N at that D, and no prediction at another D
    per seed s   (a, b, c)_s by least squares on that seed's cell gaps L_series(s) − L_baseline(s); its prediction
                 p_s = g_s(N*, D*) at the baseline's N*, D* of the predicted size
    prediction   the mean of the p_s (which is the law fitted to the cells' mean gaps: least squares is linear), with
                 the Student t interval over the k seeds' p_s (paired.mean_interval)

A seed is one data order and one init stream in every cell of both series, so the k per-seed predictions are
independent draws: the interval is exact when they are normal and the gap is linear in log2 N and log2 D over the
ladder and out to the predicted size. It holds no error of that form, and it needs every cell of both series in
each seed it uses (a seed missing one is left out, and said so)."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional

import numpy as np

from ..results import RunRecord
from .paired import mean_interval
from .select import size_of


def cells(runs: list[RunRecord], series_of: dict[str, str], n_of: Callable, loss: str) -> dict[str, dict]:
    """series -> {(size, k-th budget of that size): {"N", "D", "by_seed": {seed: loss}}}."""
    out: dict[str, dict] = defaultdict(dict)
    budgets: dict[tuple, set] = defaultdict(set)
    for r in runs:
        budgets[(series_of[r.run_dir], size_of(r.model, r.arch))].add(r.tokens)
    for r in runs:
        series, size = series_of[r.run_dir], size_of(r.model, r.arch)
        key = (size, sorted(budgets[(series, size)]).index(r.tokens))
        cell = out[series].setdefault(key, {"N": n_of(r), "D": r.tokens, "by_seed": {}})
        cell["by_seed"][r.seed] = getattr(r, loss)
    return dict(out)


def fit(series: dict, base: dict, n: float, d: float, level: float) -> Optional[dict]:
    """The gap law of `series` against `base` (both from `cells`) and its prediction at the baseline's (n, d); None
    without shared cells that fix its coefficients, 2 seeds holding all of them, or (on a ladder of one budget) a
    prediction at that budget."""
    keys = sorted(set(series) & set(base))
    if not keys:
        return None
    log_d = np.log2([base[k]["D"] for k in keys])
    one_budget = bool(np.ptp(log_d) == 0)
    if one_budget and np.log2(d) != log_d[0]:
        return None  # the ladder says nothing about the gap's change with D

    def terms(n: float, d: float) -> list[float]:  # 1, log2 N (, log2 D where the ladder's budgets vary)
        return [1.0, np.log2(n)] + ([] if one_budget else [np.log2(d)])

    x = np.array([terms(base[k]["N"], base[k]["D"]) for k in keys])
    if len(keys) < x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    every = [set(series[k]["by_seed"]) & set(base[k]["by_seed"]) for k in keys]
    seeds = sorted(set.intersection(*every))
    if len(seeds) < 2:
        return None
    target = np.array(terms(n, d))
    coef = np.array(
        [
            np.linalg.lstsq(x, [series[k]["by_seed"][s] - base[k]["by_seed"][s] for k in keys], rcond=None)[0]
            for s in seeds
        ]
    )
    iv = mean_interval(coef @ target, level)
    left_out = sorted(set.union(*every) - set(seeds))
    return {"gap": iv.value, "low": iv.low, "high": iv.high, "seeds": len(seeds), "cells": len(keys),
            "coef": coef.mean(axis=0).tolist(), "left_out": left_out}  # fmt: skip


def add(rows: list[dict], runs: list[RunRecord], series_of: dict[str, str], n_of: Callable, loss: str, level: float):
    """Each prediction row with a baseline gets `law`: its gap law's prediction at the baseline's (N, D)."""
    by = cells([r for r in runs if r.run_dir in series_of and r.tokens], series_of, n_of, loss)
    at = {w["series"]: w for w in rows}
    for w in rows:
        base = w.get("baseline")
        if base and w["series"] in by and base in by:
            got = fit(by[w["series"]], by[base], at[base]["N"], at[base]["D"], level)
            if got is not None:
                w["law"] = got
