"""Learning-rate transfer across width (issue 32 §2): the best learning rate of each (series, parametrization, width)
from a quadratic in log2(lr) fitted over every seed's runs (not best-of-grid), how far it moves per doubling of the
width, and `lr_from`: a tuning sweep's fitted optimum at the base width, for a sweep that then tunes nothing.

A run's width is its `model.d_model` axis (else its preset's d_model), its parametrization its
`model.parametrization` axis (else sp), its series the arch with its other varying axes (`diff lambda_init=0.8`),
the lr, width and parametrization left out. Its loss is summary.json's final_val_loss (the whole held-out set)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from ..errors import UserError
from ..model.presets import load_preset
from ..results import WIDTH_KEY as WIDTH
from ..results import RunRecord, collect, read_csv
from .select import series_without

LR, PARAM = "optim.lr", "model.parametrization"
SPAN = 5  # grid values a quadratic is fitted over: the best mean and up to 2 either side


@dataclass(frozen=True)
class Point:
    lr: float
    seed: Optional[int]
    loss: float


@dataclass(frozen=True)
class Optimum:
    log2_lr: float  # the quadratic's minimum
    coeffs: tuple[float, float, float]  # loss ~ c2 x^2 + c1 x + c0, x = log2(lr)
    inside: bool  # the minimum lies within the fitted grid values (else extrapolated)
    lrs: tuple[float, ...]  # the grid values the quadratic was fitted over

    @property
    def lr(self) -> float:
        return 2.0**self.log2_lr

    def loss_at(self, log2_lr: float) -> float:
        return float(np.polyval(self.coeffs, log2_lr))


@cache
def _preset_width(model: str) -> int:
    return load_preset(model).d_model


def width_of(r: RunRecord) -> int:
    return int(r.axes[WIDTH]) if r.axes.get(WIDTH) is not None else _preset_width(r.model)


def parametrization_of(r: RunRecord) -> str:
    return str(r.axes.get(PARAM) or "sp")


def curves(records: Sequence[RunRecord]) -> dict[tuple[str, str, int], list[Point]]:
    """(series, parametrization, width) -> every finished run's (lr, seed, final val loss); a sweep without an lr
    axis is a one-line error. Runs whose loss is not finite (diverged) are kept as inf: they count against their lr."""
    if not any(r.axes.get(LR) is not None for r in records):
        raise UserError(f"no {LR} axis in these runs: a transfer study needs an lr grid at each width")
    series = series_without(records, {LR, WIDTH, PARAM})
    out: dict[tuple[str, str, int], list[Point]] = defaultdict(list)
    for r in records:
        if r.status != "finished" or r.axes.get(LR) is None:
            continue
        loss = r.final_val_loss if r.final_val_loss is not None and math.isfinite(r.final_val_loss) else math.inf
        out[(series[r.run_dir], parametrization_of(r), width_of(r))].append(Point(float(r.axes[LR]), r.seed, loss))
    return dict(sorted(out.items()))


def fit_optimum(points: Iterable[Point], span: int = SPAN) -> Optional[Optimum]:
    """The minimum of a quadratic in log2(lr) fitted over every point at the `span` grid values around the best mean
    loss (all seeds, each point once); None when fewer than 3 values have finite losses or the fit curves down."""
    by_lr: dict[float, list[float]] = defaultdict(list)
    for p in points:
        by_lr[p.lr].append(p.loss)
    lrs = sorted(v for v, ls in by_lr.items() if all(math.isfinite(x) for x in ls))
    if len(lrs) < 3:
        return None
    best = min(range(len(lrs)), key=lambda i: sum(by_lr[lrs[i]]) / len(by_lr[lrs[i]]))
    lo = min(max(best - span // 2, 0), max(len(lrs) - span, 0))
    window = lrs[lo : lo + span]
    x = np.array([math.log2(v) for v in window for _ in by_lr[v]])
    y = np.array([loss for v in window for loss in by_lr[v]])
    c2, c1, c0 = np.polyfit(x, y, 2)
    if not c2 > 0:
        return None
    x_star = -c1 / (2 * c2)
    inside = math.log2(window[0]) <= x_star <= math.log2(window[-1])
    return Optimum(float(x_star), (float(c2), float(c1), float(c0)), inside, tuple(window))


def tuning_records(source: str, seeds: Optional[list[int]] = None) -> list[RunRecord]:
    """`lr_from`'s runs: a collected runs.csv or a sweep directory, on `seeds` only when given (one line when one of
    them, or the source, is missing)."""
    path = Path(source)
    if not path.exists():
        raise UserError(f"lr_from={source}: does not exist (give a tuning sweep's directory or its runs.csv)")
    records = read_csv(path) if path.is_file() else collect(path)
    if seeds:
        missing = sorted(set(seeds) - {r.seed for r in records})
        if missing:
            raise UserError(f"lr_from_seeds={list(seeds)}: {source} has no runs of seed {missing[0]}")
        records = [r for r in records if r.seed in set(seeds)]
    return records


def tuned_lrs(source: str, base_width: int, seeds: Optional[list[int]] = None) -> dict[str, tuple[float, int]]:
    """`lr_from`: arch -> (its fitted optimum lr at width `base_width`, the runs it rests on), from a collected
    runs.csv or a sweep directory. Under mup the runs at the base width are sp's model, so both count; an arch with
    two series (two lambda_init values), no runs at that width, or no interior optimum is a one-line error."""
    return optimum_lrs(tuning_records(source, seeds), base_width, source)


def optimum_lrs(records: Sequence[RunRecord], base_width: int, source: str) -> dict[str, tuple[float, int]]:
    """tuned_lrs on records already read."""
    found = curves(records)
    by_arch: dict[str, list[tuple[str, list[Point]]]] = defaultdict(list)
    for (series, _, width), points in found.items():
        if width == base_width:
            by_arch[series.split(" ", 1)[0]].append((series, points))
    out = {}
    for arch, entries in by_arch.items():
        names = sorted({s for s, _ in entries})
        if len(names) > 1:
            raise UserError(f"lr_from={source}: arch {arch} has {len(names)} series ({', '.join(names)}); tune one")
        points = [p for _, ps in entries for p in ps]
        opt = fit_optimum(points)
        if opt is None or not opt.inside:
            grid = sorted({p.lr for p in points})
            raise UserError(
                f"lr_from={source}: {arch} at d_model {base_width} has no optimum inside its lr grid "
                f"{[f'{v:g}' for v in grid]}; widen the grid"
            )
        out[arch] = (float(f"{opt.lr:.3g}"), len(points))
    if not out:
        widths = sorted({w for _, _, w in found})
        raise UserError(f"lr_from={source}: no runs at the base width d_model {base_width} (its widths: {widths})")
    return out
