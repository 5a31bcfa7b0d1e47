"""Scaling figures (matplotlib, PNG, log axes), each a figure a report can cite: final loss vs parameters with the
L(N) fits, final loss vs training tokens with the L(N, D) fit at each size, loss vs training compute with each
compute-optimal frontier and the iso-FLOP curves (diffllm/scaling/optimal.py). Every point is the loss the tables use
(`loss`, final_val_loss: the whole held-out set, at each run's own budget: a WSD cooldown's result, not its stable
run's mid-run value); in-loop validation (a subset of the held-out set) is drawn only where the L(N, D) fit was made
on it (joint=curves), and marked so. A title names a fit only where one was made, and fits.md's caveats (a fit refused
or at a bound, a frontier of a degenerate fit, under-trained runs: open markers) are printed under the axes. Every
series side by side, in the label and colour its attention variant carries (diffllm/model/variant.py); series of one
arch share its colour and differ in line style and marker."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..model.registry import variants  # noqa: E402
from ..results import RunRecord  # noqa: E402
from .fit import POWER_LAW_PARAMS, at_bounds, exactly_determined  # noqa: E402
from .inputs import val_curve  # noqa: E402

STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))  # (line style, marker) per series of one arch
DEGENERATE = ("A=0", "B=0", "alpha at grid end", "beta at grid end")  # L(N, D) flags that leave no frontier
LOSS_LABEL = {"final_val_loss": "final validation loss (whole held-out set)", "final_train_loss": "final training loss"}


@dataclass
class FigureData:
    """What the figures of one `scaling fit` draw: the runs of each fit, the fits, and what fits.md notes."""

    title: str
    n_label: str  # the N axis (block, non-embedding or total parameters)
    loss: str  # the RunRecord field of every point (final_val_loss | final_train_loss)
    n_of: Callable[[RunRecord], float]
    series: dict[str, str]  # run_dir -> series
    at_budget: list[RunRecord]  # L(N)'s runs
    fits: dict  # series -> PowerLaw
    done: list[RunRecord]  # L(N, D)'s runs (every budget)
    joint: dict  # series -> JointLaw
    mode: str  # the L(N, D) points: final | curves | none
    optimal: object = None  # optimal.OptimalPlot, or None
    notes: list[str] = field(default_factory=list)
    left_out: int = 0  # under-trained runs left out of the fits (exclude_undertrained=true)


def _arch(series: str) -> str:
    return series.split(" ", 1)[0]


def _color(series: str) -> str:
    v = variants().get(_arch(series))
    return v.color if v else "k"


def _label(series: str) -> str:
    v = variants().get(_arch(series))
    rest = series.split(" ", 1)[1:]
    return " ".join([v.label if v else _arch(series), *rest])


def _styles(series: list[str]) -> dict[str, tuple[str, str]]:
    """Each series' (line style, marker): the k-th series of an arch gets STYLES[k]."""
    seen: dict[str, int] = {}
    out = {}
    for s in sorted(series):
        k = seen.get(_arch(s), 0)
        seen[_arch(s)] = k + 1
        out[s] = STYLES[k % len(STYLES)]
    return out


def _groups(runs: list[RunRecord], series: dict[str, str]) -> dict[str, list[RunRecord]]:
    """Runs by series, in registered-variant order (baseline first), then by label."""
    order = {a: i for i, a in enumerate(variants())}
    out: dict[str, list[RunRecord]] = {}
    for r in sorted(runs, key=lambda r: (order.get(r.arch, len(order)), series[r.run_dir])):
        out.setdefault(series[r.run_dir], []).append(r)
    return out


def _plain_loss_axis(ax) -> None:
    """Log-scaled loss axis with plain numbers (4.5, not 4.5 x 10^0)."""
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))


def _points(ax, x, y, under, color, marker: str, size: float, label: Optional[str]) -> None:
    """Runs as markers: filled, or open for an under-trained run."""
    x, y, under = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(under, dtype=bool)
    ax.scatter(x[~under], y[~under], color=color, marker=marker, s=size, zorder=3, label=label)
    if under.any():
        ax.scatter(x[under], y[under], facecolors="none", edgecolors=color, marker=marker, s=size, zorder=3)


def _finish(fig, caveats: list[str]) -> None:
    """fits.md's caveats for this figure under its axes (the figure grows to hold them), then the layout."""
    if caveats:
        lines = ["caveats (fits.md says more):"]
        lines += [textwrap.fill(c, 118, initial_indent="- ", subsequent_indent="  ") for c in caveats]
        text = "\n".join(lines)
        width, height = fig.get_size_inches()
        extra = 0.12 * (text.count("\n") + 1) + 0.15
        fig.set_size_inches(width, height + extra)
        fig.text(0.01, 0.02, text, fontsize=6, va="bottom", ha="left", family="monospace")
        fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))
    else:
        fig.tight_layout()


def save(fig, path: Path) -> Path:
    fig.savefig(path)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------------- caveats
def _reason(notes: list[str], prefix: str) -> str:
    """Why a fit was not made, from its note (`L(N) for diff: no fit (refused: ...)`)."""
    for n in notes:
        for word in (": no fit (", ": skipped ("):
            if n.startswith(prefix) and word in n:
                return n.split(word, 1)[1].removesuffix(")")
    return "see fits.md"


def _under(runs: list[RunRecord], d: FigureData) -> list[str]:
    out = []
    under = sum(bool(r.under_trained) for r in runs)
    if under:
        out.append(f"{under} of {len(runs)} runs under-trained (final loss >= bigram baseline): open markers, fitted")
    if d.left_out:
        out.append(f"{d.left_out} under-trained run(s) left out of the fits and the figures (exclude_undertrained)")
    return out


def power_caveats(d: FigureData) -> list[str]:
    out = []
    for s, rs in _groups(d.at_budget, d.series).items():
        f = d.fits.get(s)
        if f is None:
            out.append(f"no L(N) fit for {_label(s)}: {_reason(d.notes, f'L(N) for {s}:')}")
            continue
        if at_bounds(f):
            out.append(f"L(N) for {_label(s)} at a bound ({', '.join(at_bounds(f))}): a flag, not an estimate")
        if exactly_determined(len(rs), POWER_LAW_PARAMS):
            out.append(f"L(N) for {_label(s)}: {len(rs)} points for 3 parameters, exactly determined: no interval")
    return out + _under(d.at_budget, d)


def joint_caveats(d: FigureData, frontier: bool = False) -> list[str]:
    if d.mode == "none":
        return ["joint=none: no L(N, D) fit"] + _under(d.done, d)
    out = []
    for s in _groups(d.done, d.series):
        law = d.joint.get(s)
        if law is None:
            out.append(f"no L(N, D) fit for {_label(s)}: {_reason(d.notes, f'L(N, D) for {s} ')}")
            continue
        flags = at_bounds(law)
        if any(f in DEGENERATE for f in flags):
            tail = ": a degenerate fit, no frontier drawn" if frontier else ": a flag, not an estimate"
            out.append(f"L(N, D) for {_label(s)} at a bound ({', '.join(flags)}){tail}")
        elif flags:
            out.append(f"L(N, D) for {_label(s)}: E = 0 is its bound, so the irreducible loss is undetermined")
    if d.mode == "curves":
        out.append("L(N, D) fitted to in-loop validation (a subset of the held-out set): small points")
    return out + _under(d.done, d)


def degenerate(law) -> bool:
    return any(f in DEGENERATE for f in at_bounds(law))


# ------------------------------------------------------------------------------------------------------- figures
def figures(d: FigureData) -> dict[str, object]:
    """{file name: matplotlib Figure} of one `scaling fit`, unsaved (save() writes one)."""
    out = {"loss_vs_params.png": loss_vs_params(d)}
    if d.done:
        out["loss_vs_tokens.png"] = loss_vs_tokens(d)
    if d.optimal is not None:
        out["loss_vs_compute.png"] = loss_vs_compute(d)
        out["iso_flop.png"] = iso_flop_curves(d)
    return out


def loss_vs_params(d: FigureData):
    """Each L(N) run's final loss at its N (points), and each series' L(N) where one was fitted (line)."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    groups = _groups(d.at_budget, d.series)
    ns = [d.n_of(r) for r in d.at_budget]
    grid = np.geomspace(min(ns) / 1.3, max(ns) * 1.3, 200)
    styles = _styles(list(groups))
    for s, rs in groups.items():
        line, marker = styles[s]
        n = [d.n_of(r) for r in rs]
        _points(
            ax,
            n,
            [getattr(r, d.loss) for r in rs],
            [bool(r.under_trained) for r in rs],
            _color(s),
            marker,
            22,
            f"{_label(s)} runs",
        )
        f = d.fits.get(s)
        if f is not None:
            ax.plot(
                grid,
                f(grid),
                color=_color(s),
                lw=1.5,
                ls=line,
                label=f"{_label(s)}: {f.E:.3f} + {f.A:.3g}·N^-{f.alpha:.3f}",
            )
    budget = f" at D = {d.at_budget[0].tokens:,} tokens" if d.at_budget else ""
    what = "L(N)" if d.fits else "final loss vs N (no L(N) fit: see fits.md)"
    ax.set(xscale="log", yscale="log", xlabel=d.n_label, ylabel=LOSS_LABEL[d.loss], title=f"{d.title}: {what}{budget}")
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _finish(fig, power_caveats(d))
    return fig


def loss_vs_tokens(d: FigureData):
    """Each run's final loss at its own budget (points; darker = larger N), each series' L(N, D) at each N (line);
    with joint=curves, the in-loop validation the fit was made on (small points) too."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    by_size: dict[tuple[str, float], list[RunRecord]] = {}
    for s, rs in _groups(d.done, d.series).items():
        for r in sorted(rs, key=lambda r: (d.n_of(r), r.tokens or 0, r.seed or 0)):
            by_size.setdefault((s, d.n_of(r)), []).append(r)
    sizes = sorted({n for _, n in by_size})
    shades = {n: 0.35 + 0.65 * i / max(len(sizes) - 1, 1) for i, n in enumerate(sizes)}
    styles = _styles(list({s for s, _ in by_size}))
    for (s, n), rs in by_size.items():
        color = matplotlib.colors.to_rgba(_color(s), shades[n])
        line, marker = styles[s]
        tokens = [float(r.tokens) for r in rs]
        if d.mode == "curves":  # the points the fit was made on
            for r in rs:
                t, y = val_curve(r.run_dir)
                ax.scatter(t, y, color=color, marker=".", s=6, zorder=2, alpha=0.6)
                tokens += list(t)
        label = f"{_label(s)} N={n:,.0f}"
        _points(
            ax,
            [r.tokens for r in rs],
            [getattr(r, d.loss) for r in rs],
            [bool(r.under_trained) for r in rs],
            color,
            marker,
            16,
            label,
        )
        if d.joint.get(s) is not None:
            grid = np.geomspace(min(tokens), max(tokens), 100)
            ax.plot(grid, d.joint[s](n, grid), color=color, lw=1.2, ls=line)
    if d.mode == "none" or not d.joint:
        what = f"final loss vs tokens (no L(N, D) fit{'' if d.mode == 'none' else ': see fits.md'})"
    else:
        what = f"final loss vs tokens, L(N, D) fit ({'in-loop curves' if d.mode == 'curves' else 'final points'})"
    ax.set(xscale="log", yscale="log", xlabel="training tokens", ylabel=LOSS_LABEL[d.loss], title=f"{d.title}: {what}")
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, title="points: runs; lines: fit; darker = larger N", title_fontsize=6)
    _finish(fig, joint_caveats(d))
    return fig


def loss_vs_compute(d: FigureData):
    """The Chinchilla figure: every run's final loss at its training compute C = f D (points), and each series'
    compute-optimal frontier L*(C) (line) where its L(N, D) is not degenerate (a coefficient at 0 or an exponent at
    the end of its grid: the frontier would run along the search range's edge, below every run)."""
    opt = d.optimal
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    styles = _styles(list(opt.runs))
    drawn = 0
    for s, r in opt.runs.items():
        line, marker = styles[s]
        under = r.under if r.under is not None else np.zeros(len(r.C), dtype=bool)
        _points(ax, r.C, r.loss, under, _color(s), marker, 16, f"{_label(s)} runs")
        fr = opt.frontiers.get(s)
        if fr is not None and not degenerate(d.joint[s]):
            ax.plot(fr.C, fr.loss, color=_color(s), ls=line, lw=1.5, label=f"{_label(s)}: frontier L*(C)")
            drawn += 1
    what = "compute-optimal frontier" if drawn else "final loss vs compute (no frontier: see fits.md)"
    ax.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)", ylabel=LOSS_LABEL[d.loss])
    ax.set_title(f"{d.title}: {what}")
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _finish(fig, joint_caveats(d, frontier=True))
    return fig


def iso_flop_curves(d: FigureData):
    """Loss vs N at a few fixed C from each series' L(N, C / f(N)) (lines, darker = more compute), the optimum on each
    (star; none for a degenerate fit), and each run at the C nearest its own compute (points in that C's shade: on the
    curve only where its compute is that C)."""
    opt = d.optimal
    series = list(opt.iso)
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 4.2), dpi=120, sharey=True, squeeze=False)
    log_c = np.log(opt.iso_C)
    shades = 0.35 + 0.65 * np.arange(len(log_c)) / max(len(log_c) - 1, 1)
    for ax, s in zip(axes[0], series):
        n, loss, best = opt.iso[s]
        r = opt.runs[s]
        under = r.under if r.under is not None else np.zeros(len(r.C), dtype=bool)
        nearest = np.argmin(np.abs(np.log(r.C)[:, None] - log_c[None, :]), axis=1)  # each run's nearest C
        for k, c in enumerate(opt.iso_C):
            color = matplotlib.colors.to_rgba(_color(s), shades[k])
            ax.plot(n, loss[k], color=color, lw=1.3, label=f"C = {c:.3g}")
            if not degenerate(d.joint[s]):
                ax.scatter([best.N_opt[k]], [best.loss[k]], color=color, marker="*", s=70, zorder=4)
            at = nearest == k
            _points(ax, r.N[at], r.loss[at], under[at], color, "o", 14, None)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=d.n_label,
            title=_label(s),
            ylim=(None, 1.25 * max(r.loss.max(), loss[0].min())),
        )  # the curves' far ends climb without bound
        _plain_loss_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, title="lines: fit; *: optimum; points: runs", title_fontsize=6)
    axes[0][0].set_ylabel(LOSS_LABEL[d.loss])
    fig.suptitle(f"{d.title}: iso-FLOP curves", fontsize=9)
    _finish(fig, joint_caveats(d, frontier=True))
    return fig
