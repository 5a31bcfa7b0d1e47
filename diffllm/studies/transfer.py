"""`diffllm study transfer`: does the best learning rate transfer across width (configs/sweep/micro-transfer.yaml,
docs/micro-scaling.md#learning-rate-transfer-across-width), and how does it move with the token horizon
(configs/sweep/horizon-tune.yaml, diffllm/scaling/horizon.py: lr*(D) = B·D^-β per series, with its interval)?

Per (series, parametrization) of a sweep with an lr grid at several widths (diffllm/scaling/transfer.py): the best lr
at each width from a quadratic in log2(lr) over every seed's runs, the shift of that optimum per doubling of the width
(the least-squares slope of log2 lr* on log2 d_model) with a 90% interval from resampling seeds (each series with its
own generator), and the loss lost at the widest model by training it at the narrowest model's optimum (on the widest
model's fitted curve, and on its grid means at the tried value nearest that optimum). Where sp and mup runs share a
width, lr and seed, the largest |difference| of their losses is printed: at the base width the two are one model.
A sweep at several token budgets gets the width table per budget (with two widths there) and the horizon table: each
series' lr* per budget and the fitted β with its 90% interval from resampling seeds (horizon.json).
Writes <out>/transfer.md, transfer.json and transfer.png."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..config import run_key_values
from ..errors import UserError
from ..scaling.horizon import fit_law, horizon_curves
from ..scaling.transfer import PARAM, Optimum, Point, curves, fit_optimum, width_of
from ..sweep.grid import token_label
from .common import emit, folder_of, read_records


@dataclass
class Config:
    """The lr transfer table and figure of a sweep over width x lr x parametrization (x seeds)."""

    sweep_dir: str = ""  # the sweep's directory or its collected runs.csv
    out: Optional[str] = None  # the folder for transfer.md/.json/.png (default: the sweep's folder)
    resamples: int = 2000  # seed resamples behind each interval
    seeds: Optional[list[int]] = None  # the seeds analysed (null: every seed; a sweep still running its last seed)
    seed: int = 0  # the resampling generators' root seed


@dataclass
class Series:
    """One (series, parametrization): its fitted optimum at each width and what follows from them."""

    name: str
    parametrization: str
    widths: list[int]
    optima: dict[int, Optional[Optimum]]
    shift: Optional[float]  # d log2 lr* / d log2 width
    shift_ci: tuple[float, float]
    lost_fit: Optional[float]  # widest model: loss at the narrowest's lr* minus at its own, on its fitted quadratic
    lost_grid: Optional[float]  # ... on its grid means: at the tried lr nearest the narrowest's lr*, minus the best
    seeds: list
    lost_fit_outside: bool = False  # the narrowest's lr* lies outside the values the widest model's quadratic fitted


def slope(optima: dict[int, Optional[Optimum]]) -> Optional[float]:
    """The least-squares slope of log2 lr* on log2 width over the widths with an optimum (>= 2 of them)."""
    pts = [(math.log2(w), o.log2_lr) for w, o in optima.items() if o is not None]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def grid_means(points: list[Point]) -> dict[float, float]:
    by_lr: dict[float, list[float]] = defaultdict(list)
    for p in points:
        by_lr[p.lr].append(p.loss)
    return {lr: sum(ls) / len(ls) for lr, ls in sorted(by_lr.items())}


def resampled_shift(by_width: dict[int, list[Point]], seeds: list, rng: np.random.Generator) -> Optional[float]:
    """The shift refitted on a resample of the seeds (drawn with replacement, the same draw at every width)."""
    draw = list(rng.choice(np.array(seeds, dtype=object), size=len(seeds), replace=True))
    optima = {w: fit_optimum([p for s in draw for p in pts if p.seed == s]) for w, pts in by_width.items()}
    return slope(optima)


def analyse(name: str, parametrization: str, by_width: dict[int, list[Point]], rng, resamples: int) -> Series:
    widths = sorted(by_width)
    optima = {w: fit_optimum(by_width[w]) for w in widths}
    seeds = sorted({p.seed for pts in by_width.values() for p in pts}, key=lambda s: (s is None, s or 0))
    draws = [resampled_shift(by_width, seeds, rng) for _ in range(resamples)]
    draws = [d for d in draws if d is not None]
    ci = (math.nan, math.nan)
    if draws and len(seeds) > 1:
        ci = (float(np.percentile(draws, 5)), float(np.percentile(draws, 95)))
    narrow, wide = optima[widths[0]], optima[widths[-1]]
    lost_fit = lost_grid = None
    outside = False
    if narrow is not None and wide is not None and len(widths) > 1:
        lost_fit = wide.loss_at(narrow.log2_lr) - wide.loss_at(wide.log2_lr)
        outside = not math.log2(wide.lrs[0]) <= narrow.log2_lr <= math.log2(wide.lrs[-1])
        means = grid_means(by_width[widths[-1]])
        nearest = min(means, key=lambda lr: abs(math.log2(lr) - narrow.log2_lr))
        lost_grid = means[nearest] - min(means.values())
    return Series(name, parametrization, widths, optima, slope(optima), ci, lost_fit, lost_grid, seeds, outside)


def sp_mup_gap(records) -> dict[int, tuple[float, int]]:
    """width -> (max |loss(sp) - loss(mup)|, pairs) over runs equal in everything but the parametrization axis: 0 at
    the base width, where the two are one model."""
    runs: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.status == "finished" and r.final_val_loss is not None and r.axes.get(PARAM) in ("sp", "mup"):
            key = (r.model, r.seed, width_of(r), tuple(sorted((k, repr(v)) for k, v in r.axes.items() if k != PARAM)))
            runs[key][r.axes[PARAM]] = r.final_val_loss
    gaps: dict[int, list[float]] = defaultdict(list)
    for key, v in runs.items():
        if len(v) == 2:
            gaps[key[2]].append(abs(v["sp"] - v["mup"]))
    return {w: (max(g), len(g)) for w, g in sorted(gaps.items())}


def fmt(x: Optional[float], digits: int = 3, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    x = round(x, digits) + 0.0  # no -0.00
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def optimum_cell(o: Optional[Optimum]) -> str:
    if o is None:
        return "no fit"
    return f"{o.lr:.2g}" + ("" if o.inside else " (edge)")


def markdown(results: list[Series], gap) -> list[str]:
    widths = sorted({w for s in results for w in s.widths})
    head = " | ".join(f"lr* d={w}" for w in widths)
    lines = [
        f"| series | param | {head} | shift of log2 lr* per doubling [90% CI] | loss lost at d={widths[-1]} with "
        f"d={widths[0]}'s lr* (fit / grid) |",
        "|---|---|" + "---|" * len(widths) + "---|---|",
    ]
    for s in results:
        cells = " | ".join(optimum_cell(s.optima.get(w)) for w in widths)
        ci = "" if math.isnan(s.shift_ci[0]) else f" [{fmt(s.shift_ci[0], 2, True)}, {fmt(s.shift_ci[1], 2, True)}]"
        lost = fmt(s.lost_fit, 4, True) + (" (extrapolated)" if s.lost_fit_outside else "")
        lines.append(
            f"| {s.name} | {s.parametrization} | {cells} | {fmt(s.shift, 2, True)}{ci} | "
            f"{lost} / {fmt(s.lost_grid, 4, True)} |"
        )
    seeds = sorted({x for s in results for x in s.seeds}, key=lambda v: (v is None, v or 0))
    lines += [
        "",
        f"lr*: the minimum of a quadratic in log2(lr) fitted over every seed's runs at the best mean lr and up to two "
        f"tried values either side ((edge): outside them, extrapolated). Seeds {seeds}; "
        + (
            f"intervals: 5th-95th percentile over seed resamples ({len(seeds)} seeds: "
            f"{math.comb(2 * len(seeds) - 1, len(seeds))} distinct draws). "
            if len(seeds) > 1
            else "one seed: no interval. "
        )
        + "A shift of 0 is perfect transfer; -1 halves the best lr at each doubling. Loss lost: on the widest "
        "model's quadratic ((extrapolated): evaluated outside the values it was fitted on) / on its grid means.",
    ]
    if gap:
        lines.append(
            "sp vs mup on otherwise equal runs, max |loss difference| (pairs): "
            + ", ".join(f"d={w}: {g:.3g} ({n})" for w, (g, n) in gap.items())
            + ". At the base width the two are one model: 0 there checks that mup reduces to sp."
        )
    return lines


def plot(results: list[Series], by_key: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(s.name for s in results))
    params = list(dict.fromkeys(s.parametrization for s in results))
    fig, axes = plt.subplots(len(names), len(params), figsize=(4.2 * len(params), 3.2 * len(names)), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for s in results:
        ax = axes[names.index(s.name)][params.index(s.parametrization)]
        for i, w in enumerate(s.widths):
            color = cmap(i / max(len(s.widths) - 1, 1))
            pts = by_key[(s.name, s.parametrization, w)]
            ax.plot([math.log2(p.lr) for p in pts], [p.loss for p in pts], ".", color=color, alpha=0.5)
            means = grid_means(pts)
            ax.plot([math.log2(v) for v in means], list(means.values()), "-", color=color, label=f"d={w}")
            o = s.optima[w]
            if o is not None:
                xs = np.linspace(math.log2(o.lrs[0]), math.log2(o.lrs[-1]), 50)
                ax.plot(xs, np.polyval(o.coeffs, xs), ":", color=color)
                ax.plot([o.log2_lr], [o.loss_at(o.log2_lr)], "*", color=color, markersize=10)
        ax.set_title(f"{s.name}, {s.parametrization}: shift {fmt(s.shift, 2, True)}/doubling", fontsize=9)
        ax.set_xlabel("log2 lr (base lr under mup)")
        ax.set_ylabel("final val loss")
        finite = [p.loss for w in s.widths for p in by_key[(s.name, s.parametrization, w)] if math.isfinite(p.loss)]
        if finite:
            ax.set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.0) + 0.05)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def width_part(records, c: Config, out: Path) -> tuple[list[str], list[Series]]:
    """The width study of each token budget with a series at >= 2 widths (one budget: the table as before)."""
    budgets = sorted({r.tokens for r in records if r.tokens})
    lines: list[str] = []
    results: list[Series] = []
    for tokens in budgets or [None]:
        own = [r for r in records if r.tokens == tokens] if len(budgets) > 1 else list(records)
        by_key = curves(own)
        groups: dict[tuple[str, str], dict[int, list[Point]]] = defaultdict(dict)
        for (name, param, width), pts in by_key.items():
            groups[(name, param)][width] = pts
        if not any(len(ws) > 1 for ws in groups.values()):
            continue
        found = [
            analyse(name, param, by_width, np.random.default_rng([c.seed, i]), c.resamples)
            for i, ((name, param), by_width) in enumerate(sorted(groups.items()))
        ]
        figure = "transfer.png" if not results else f"transfer-{tokens}.png"
        plot(found, by_key, out / figure)
        at = f" at {tokens:,} tokens" if len(budgets) > 1 else ""
        lines += [f"Learning-rate transfer across width{at} (final val loss, whole held-out set):", ""]
        lines += markdown(found, sp_mup_gap(own)) + ["", f"![transfer]({figure})", ""]
        results += found
    return lines, results


def horizon_part(records, c: Config) -> tuple[list[str], list[dict]]:
    """The horizon law of each (series, width) trained at >= 2 token budgets, or why it has none."""
    groups: dict[tuple[str, int], dict[int, list[Point]]] = defaultdict(dict)
    for (series, width, tokens), pts in horizon_curves(records).items():
        groups[(series, width)][tokens] = pts
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return [], []
    budgets = sorted({t for v in groups.values() for t in v})
    lines = [
        "Learning-rate transfer across the token horizon, lr*(D) = B·D^-β (Bjorck et al., ICLR 2025):",
        "",
        "| series | d_model | " + " | ".join(f"lr* D={token_label(t)}" for t in budgets) + " | β [90% CI] | B |",
        "|---|---|" + "---|" * len(budgets) + "---|---|",
    ]
    laws: list[dict] = []
    for i, ((series, width), by_tokens) in enumerate(sorted(groups.items())):
        try:
            law = fit_law(series, width, by_tokens, np.random.default_rng([c.seed, 1000 + i]), c.resamples)
        except UserError as e:
            optima = {t: fit_optimum(pts) for t, pts in by_tokens.items()}
            cells = " | ".join(optimum_cell(optima.get(t)) if t in optima else "" for t in budgets)
            lines.append(f"| {series} | {width} | {cells} | no law: {e} | - |")
            continue
        cells = " | ".join(optimum_cell(law.optima.get(t)) if t in law.optima else "" for t in budgets)
        ci = "" if math.isnan(law.beta_ci[0]) else f" [{fmt(law.beta_ci[0])}, {fmt(law.beta_ci[1])}]"
        lines.append(f"| {series} | {width} | {cells} | {fmt(law.beta)}{ci} | {2**law.log2_b:.4g} |")
        laws.append({"series": series, "width": width, "beta": law.beta, "beta_ci": list(law.beta_ci),
                     "B": 2**law.log2_b, "optima": {t: (o.lr if o else None) for t, o in law.optima.items()},
                     "seeds": list(law.seeds)})  # fmt: skip
    lines += [
        "",
        "lr* at each budget as above; β: the least-squares slope of −log2 lr* on log2 D over >= 3 budgets spanning "
        ">= 16x, its interval the 5th-95th percentile over seed resamples (the same draw at every budget; draws "
        "where a budget's lr* leaves its grid are dropped). β > 0: the best lr falls as the run grows.",
    ]
    return lines, laws


def run(c: Config) -> str:
    records = read_records(c.sweep_dir, "sweep_dir", select=None, baselines=False)
    if c.seeds:
        records = [r for r in records if r.seed in set(c.seeds)]
        if not records:
            raise UserError(f"seeds={c.seeds}: no run of sweep_dir={c.sweep_dir} has these seeds")
    out = Path(c.out) if c.out else folder_of(c.sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    width_lines, results = width_part(records, c, out)
    horizon_lines, laws = horizon_part(records, c)
    if not results and not laws and not horizon_lines:
        raise UserError(
            f"sweep_dir={c.sweep_dir}: no series was trained at two widths (a model.d_model axis) or at two token "
            f"budgets"
        )
    (out / "transfer.json").write_text(json.dumps([asdict(s) for s in results], indent=1, default=str) + "\n")
    if horizon_lines:
        (out / "horizon.json").write_text(json.dumps(laws, indent=1) + "\n")
    text = "\n".join((width_lines or []) + horizon_lines).rstrip("\n")
    return emit(text + "\n", out / "transfer.md")


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study transfer", Config, run, argv)
