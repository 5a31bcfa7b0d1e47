"""Transfer across the token horizon (issue 55 §2): the best learning rate of each series at a fixed width as a power
law in the run's tokens, lr*(D) = B·D^−β (Bjorck et al., "Scaling Optimal LR Across Token Horizons", ICLR 2025),
fitted from lr sweeps at >= 3 horizons spanning >= 16x, with a 90% interval from resampling seeds; and AdamW's
weight decay from its timescale, λ = 1/(η·f·S) (Wang & Aitchison 2025; Bergsma et al. 2025, "Power Lines"): the
timescale τ_iter = 1/(ηλ) held at a fraction f of the run's S optimizer steps.

Each horizon's lr* is transfer.py's (a quadratic in log2 lr over every seed's runs around the best mean); the law is
the least-squares line of log2 lr* on log2 D: log2 lr* = log2 B − β log2 D."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import UserError
from ..results import RunRecord
from .select import series_without
from .transfer import LR, PARAM, WIDTH, Optimum, Point, fit_optimum, width_of

WD = "optim.weight_decay"
MIN_HORIZONS, MIN_SPAN = 3, 16.0  # a law needs lr* at >= 3 token budgets, the largest >= 16x the smallest


@dataclass(frozen=True)
class HorizonLaw:
    """log2 lr*(D) = log2_b − beta·log2 D for one series, with its seed-resampled (log2_b, beta) draws."""

    series: str
    width: int
    log2_b: float
    beta: float
    beta_ci: tuple[float, float]  # 5th-95th percentile over seed resamples (nan: one seed)
    optima: dict[int, Optional[Optimum]]  # tokens -> that horizon's fitted lr* (None: no fit)
    seeds: tuple
    draws: tuple[tuple[float, float], ...]  # (log2_b, beta) of each seed resample whose every horizon fitted

    def lr_at(self, tokens: float) -> float:
        return 2.0 ** (self.log2_b - self.beta * math.log2(tokens))

    def lr_ci(self, tokens: float) -> tuple[float, float]:
        """The 90% interval of lr*(tokens) over the seed resamples (nan: none)."""
        if not self.draws:
            return (math.nan, math.nan)
        x = [a - b * math.log2(tokens) for a, b in self.draws]
        return (2.0 ** float(np.percentile(x, 5)), 2.0 ** float(np.percentile(x, 95)))


def timescale_weight_decay(lr: float, fraction: float, steps: int) -> float:
    """AdamW's λ that makes its timescale 1/(lr·λ) the fraction `fraction` of a run of `steps` optimizer steps."""
    return 1.0 / (lr * fraction * steps)


def horizon_curves(records: Sequence[RunRecord]) -> dict[tuple[str, int, int], list[Point]]:
    """(series, width, tokens) -> every finished run's (lr, seed, final val loss); the series leaves out the lr, the
    weight decay (set per run by a timescale rule), the width and the parametrization. Diverged runs count as inf."""
    if not any(r.axes.get(LR) is not None for r in records):
        raise UserError(f"no {LR} axis in these runs: a horizon fit needs an lr grid at each token budget")
    series = series_without(records, {LR, WD, WIDTH, PARAM})
    out: dict[tuple[str, int, int], list[Point]] = defaultdict(list)
    for r in records:
        if r.status != "finished" or r.axes.get(LR) is None or r.tokens is None:
            continue
        loss = r.final_val_loss if r.final_val_loss is not None and math.isfinite(r.final_val_loss) else math.inf
        out[(series[r.run_dir], width_of(r), r.tokens)].append(Point(float(r.axes[LR]), r.seed, loss))
    return dict(sorted(out.items()))


def line(optima: dict[int, Optional[Optimum]]) -> Optional[tuple[float, float]]:
    """(log2_b, beta) of the least-squares line of log2 lr* on log2 tokens over the horizons with an interior
    optimum; None when fewer than MIN_HORIZONS have one."""
    pts = [(math.log2(t), o.log2_lr) for t, o in optima.items() if o is not None and o.inside]
    if len(pts) < MIN_HORIZONS:
        return None
    x, y = np.array(pts).T
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(-slope)


def problem(series: str, width: int, optima: dict[int, Optional[Optimum]]) -> Optional[str]:
    """Why these horizons give no law (None: they do): too few, too narrow a span, or an lr* at a grid's edge."""
    where = f"{series} at d_model {width}"
    if len(optima) < MIN_HORIZONS:
        return f"{where} has {len(optima)} token budgets {sorted(optima)}; a horizon law needs >= {MIN_HORIZONS}"
    if max(optima) < MIN_SPAN * min(optima):
        return f"{where}: its budgets span {max(optima) / min(optima):.3g}x; a horizon law needs >= {MIN_SPAN:g}x"
    bad = [t for t, o in optima.items() if o is None or not o.inside]
    if bad:
        return f"{where} at {bad[0]} tokens has no optimum inside its lr grid; widen the grid"
    return None


def fit_law(series: str, width: int, by_tokens: dict[int, list[Point]], rng, resamples: int) -> HorizonLaw:
    """The law of one series at one width (UserError naming the culprit when it has none), and its seed resamples:
    seeds drawn with replacement, the same draw at every horizon (a seed is one data order and init at each)."""
    optima = {t: fit_optimum(pts) for t, pts in sorted(by_tokens.items())}
    why = problem(series, width, optima)
    if why:
        raise UserError(why)
    log2_b, beta = line(optima)
    seeds = sorted({p.seed for pts in by_tokens.values() for p in pts}, key=lambda s: (s is None, s or 0))
    draws = []
    for _ in range(resamples if len(seeds) > 1 else 0):
        draw = list(rng.choice(np.array(seeds, dtype=object), size=len(seeds), replace=True))
        fitted = {t: fit_optimum([p for s in draw for p in pts if p.seed == s]) for t, pts in by_tokens.items()}
        if all(o is not None and o.inside for o in fitted.values()):
            draws.append(line(fitted))
    ci = (math.nan, math.nan)
    if draws:
        betas = [b for _, b in draws]
        ci = (float(np.percentile(betas, 5)), float(np.percentile(betas, 95)))
    return HorizonLaw(series, width, log2_b, beta, ci, optima, tuple(seeds), tuple(draws))


def horizon_laws(
    records: Sequence[RunRecord], rng_seed: int = 0, resamples: int = 2000, min_budgets: int = 2
) -> list[HorizonLaw]:
    """Every (series, width) trained at >= `min_budgets` token budgets -> its law (UserError for one without)."""
    groups: dict[tuple[str, int], dict[int, list[Point]]] = defaultdict(dict)
    for (series, width, tokens), pts in horizon_curves(records).items():
        groups[(series, width)][tokens] = pts
    return [
        fit_law(series, width, by_tokens, np.random.default_rng([rng_seed, i]), resamples)
        for i, ((series, width), by_tokens) in enumerate(sorted(groups.items()))
        if len(by_tokens) >= min_budgets
    ]


def budgets_at(records: Sequence[RunRecord], width: int) -> list[int]:
    """The token budgets of the lr-swept runs at d_model `width`."""
    return sorted({r.tokens for r in records if r.axes.get(LR) is not None and r.tokens and width_of(r) == width})


def tuned_laws(records: Sequence[RunRecord], base_width: int, source: str) -> dict[str, tuple[HorizonLaw, int]]:
    """`lr_from` with a tuning sweep at several horizons: arch -> (its law at d_model `base_width`, the runs it rests
    on); an arch with two series, or one without a law, is a one-line error naming it."""
    at_base = [r for r in records if width_of(r) == base_width]
    out: dict[str, tuple[HorizonLaw, int]] = {}
    try:
        laws = horizon_laws(at_base, min_budgets=1)
    except UserError as e:
        raise UserError(f"lr_from={source}: {e}") from None
    for law in laws:
        arch = law.series.split(" ", 1)[0]
        if arch in out:
            both = f"{out[arch][0].series}, {law.series}"
            raise UserError(f"lr_from={source}: arch {arch} has two series ({both}); tune one")
        runs = sum(1 for r in at_base if r.status == "finished" and r.axes.get(LR) is not None and r.arch == arch)
        out[arch] = (law, runs)
    return out
