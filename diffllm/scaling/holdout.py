"""`scaling fit holdout=<size or budget>`: fit without the runs of one preset size (e.g. micro-4) or one token budget
(e.g. 3072000), then predict each held-out run's final loss from the fits and compare: the error (predicted -
measured) and whether the bootstrap interval of the prediction covers the measured value. A run at the L(N) budget is
predicted by its series' L(N); any other by its series' L(N, D)."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..errors import UserError
from ..results import RunRecord
from .fit import interval
from .select import size_of


def split(runs: list[RunRecord], holdout: Optional[str]) -> tuple[list[RunRecord], list[RunRecord]]:
    """(kept, held out): held out are the runs whose preset size is `holdout`, or whose budget is (an integer)."""
    if holdout is None:
        return runs, []
    key = str(holdout)
    budget = int(key) if key.isdigit() else None
    held = [r for r in runs if (r.tokens == budget if budget is not None else size_of(r.model, r.arch) == key)]
    if not held:
        sizes = sorted({size_of(r.model, r.arch) for r in runs})
        budgets = sorted({r.tokens for r in runs if r.tokens})
        raise UserError(
            f"holdout={holdout}: no fitted run has this size or budget (sizes: {', '.join(sizes)}; budgets: "
            f"{', '.join(str(b) for b in budgets)})"
        )
    if len(held) == len(runs):
        raise UserError(f"holdout={holdout}: every run has it: nothing left to fit")
    return [r for r in runs if r not in held], held


def predictions(
    held: list[RunRecord],
    series: dict[str, str],
    n_of: Callable[[RunRecord], float],
    loss: str,
    budget: int,
    power: tuple[dict, dict],
    joint: tuple[dict, dict],
    level: float,
) -> list[dict]:
    """One row per held-out run: the law that predicts it, the prediction with its interval, the measured loss, the
    error and whether the interval covers it (None: no fit of its series to predict from)."""
    rows = []
    for r in sorted(held, key=lambda r: (series[r.run_dir], n_of(r), r.tokens or 0, r.seed or 0)):
        s, n, d = series[r.run_dir], n_of(r), r.tokens
        if r.tokens == budget and s in power[0]:
            law, best, boot = "L(N)", float(power[0][s](n)), [float(b(n)) for b in power[1][s]]
        elif s in joint[0]:
            law, best, boot = "L(N, D)", float(joint[0][s](n, d)), [float(b(n, d)) for b in joint[1][s]]
        else:
            law, best, boot = None, None, []
        measured = getattr(r, loss)
        row = {"series": s, "size": size_of(r.model, r.arch), "tokens": d, "seed": r.seed, "measured": measured}
        if law is None:
            rows.append({**row, "law": None, "predicted": None, "low": None, "high": None, "error": None})
            continue
        iv = interval(best, boot, level)
        covered = bool(np.isfinite(iv.low) and iv.low <= measured <= iv.high)
        rows.append(
            {**row, "law": law, "predicted": best, "low": iv.low, "high": iv.high, "error": best - measured}
            | {"covered": covered}
        )
    return rows


def markdown(holdout: str, rows: list[dict], level: float) -> list[str]:
    if not rows:
        return []
    scored = [w for w in rows if w["predicted"] is not None]
    covered = sum(w["covered"] for w in scored)
    worst = max((abs(w["error"]) for w in scored), default=float("nan"))
    lines = [
        f"Held out (holdout={holdout}): fitted without these runs, then predicted; error = predicted - measured; "
        f"{covered}/{len(scored)} inside their {level:.0%} interval, worst |error| {worst:.4f}:",
        "",
        "| series | size | tokens | seed | law | predicted [interval] | measured | error | covered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in rows:
        if w["predicted"] is None:
            pred, err, cov = "- (no fit of this series)", "-", "-"
        else:
            pred = f"{w['predicted']:.4f} [{w['low']:.4f}, {w['high']:.4f}]"
            err, cov = f"{w['error']:+.4f}", "yes" if w["covered"] else "no"
        lines.append(
            f"| {w['series']} | {w['size']} | {w['tokens']:,} | {w['seed']} | {w['law'] or '-'} | {pred} | "
            f"{w['measured']:.4f} | {err} | {cov} |"
        )
    return lines
