"""How a hyperparameter is chosen and on which runs the result is reported (the *selection protocol*).

    split      choose on the runs of `select_seeds`, report the runs of `report_seeds` at the chosen value: the
               reported numbers were not used to pick the value (no winner's curse). Default when the runs hold
               >= 2 seeds: the smallest seed selects, the others report.
    quadratic  fit the metric as a quadratic in log(value) over every seed's runs, take the tried value nearest its
               minimum (maximum for accuracies), report every seed there: the choice rests on the whole curve, not
               on the single best noisy point (still the same seeds; less optimistic than `same`, not unbiased).
    same       best-of-grid on the mean over the seeds that are then reported (optimistic: what `sweep collect`
               and `scaling fit` did before issue 32). Default with one seed, where no split exists.

A group that tried a single value (or a sweep without a select axis) chose nothing: its every run is reported, under
any protocol.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import UserError

PROTOCOLS = ("auto", "split", "quadratic", "same")


@dataclass(frozen=True)
class Protocol:
    mode: str  # split | quadratic | same
    select_seeds: tuple = ()  # split: the seeds the value is chosen on
    report_seeds: tuple = ()  # split: the seeds reported at it

    def describe(self) -> str:
        if self.mode == "split":
            return (
                f"protocol split: chosen on seed(s) {_seeds(self.select_seeds)}, reported on seed(s) "
                f"{_seeds(self.report_seeds)} only"
            )
        if self.mode == "quadratic":
            return "protocol quadratic: the tried value nearest the optimum of a quadratic in log(value), every seed"
        return "protocol same: chosen and reported on the same seeds (optimistic: the reported runs picked the value)"


def _seeds(seeds: Sequence) -> str:
    return ", ".join(str(s) for s in seeds)


def check_protocol(mode: str, select_seeds: Optional[Sequence] = None, report_seeds: Optional[Sequence] = None) -> None:
    """A one-line error for an unknown protocol (with a did-you-mean), or seeds named for a protocol without a split."""
    if mode not in PROTOCOLS:
        near = difflib.get_close_matches(str(mode), PROTOCOLS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"select_protocol={mode}: expected one of {', '.join(PROTOCOLS)}{hint}")
    if (select_seeds or report_seeds) and mode in ("quadratic", "same"):
        raise UserError(f"select_protocol={mode}: select_seeds/report_seeds go with select_protocol=split (or auto)")


def resolve(
    mode: str, seeds: Sequence, select_seeds: Optional[Sequence] = None, report_seeds: Optional[Sequence] = None
) -> Protocol:
    """The protocol for runs holding `seeds`: `auto` is split with >= 2 seeds (the smallest selects), else same.
    Naming select_seeds or report_seeds means split; a seed in both, or a split without two seeds, is a one-line
    error."""
    check_protocol(mode, select_seeds, report_seeds)
    seeds = sorted(set(seeds), key=lambda s: (s is None, s or 0))
    named = bool(select_seeds or report_seeds)
    if mode == "auto":
        mode = "split" if named or len(seeds) >= 2 else "same"
    if mode != "split":
        return Protocol(mode)
    sel = tuple(select_seeds or ([s for s in seeds if s not in set(report_seeds or ())][:1]))
    rep = tuple(report_seeds or (s for s in seeds if s not in set(sel)))
    both = sorted(set(sel) & set(rep))
    if both:
        raise UserError(f"select_seeds and report_seeds share seed {both[0]}: a seed either selects or reports")
    if not sel or not rep:
        raise UserError(
            f"select_protocol=split: needs a seed to select on and one to report (the runs hold seed(s) "
            f"{_seeds(seeds)})"
        )
    return Protocol("split", sel, rep)


def quadratic_optimum(values: Sequence[Any], metric: Sequence[float], higher_is_better: bool) -> Optional[float]:
    """The value at the optimum of metric ~ a + b x + c x^2, x = log(value), fitted over every run (values > 0,
    >= 3 distinct); None when it has no interior optimum (curved the wrong way) or cannot be fitted."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        return None
    x, y = np.log(np.asarray(values, dtype=float)), np.asarray(metric, dtype=float)
    if len(np.unique(x)) < 3:
        return None
    c, b, _ = np.polyfit(x, -y if higher_is_better else y, 2)
    if not c > 0:
        return None
    return float(math.exp(-b / (2 * c)))


def nearest(values: Sequence[Any], target: float) -> int:
    """The index of the tried value nearest `target` in log."""
    return min(range(len(values)), key=lambda i: (abs(math.log(values[i]) - math.log(target)), i))
