"""Scaling plots (matplotlib, PNG, log axes): final loss vs parameters with the L(N) fits, validation loss vs
tokens (learning curves) with the L(N, D) fit at each size, loss vs training compute with each compute-optimal frontier
and the iso-FLOP curves (diffllm/scaling/optimal.py); every series side by side in each figure, in the label and
colour its attention variant carries (diffllm/model/variant.py). A series is an arch or an arch with axis values
(`diff λ_init=0.8`): series of one arch share its colour and differ in line style and marker."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..model.registry import variants  # noqa: E402

STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))  # (line style, marker) per series of one arch


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


def _plain_loss_axis(ax) -> None:
    """Log-scaled loss axis with plain numbers (4.5, not 4.5 x 10^0)."""
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))


def _save(fig, ax, path: Path, legend_fontsize: int = 7) -> Path:
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_vs_params(
    points: dict[str, tuple[np.ndarray, np.ndarray]], fits: dict, path: Path, xlabel: str, title: str
) -> Path:
    """points: series -> (N, loss); fits: series -> PowerLaw."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    lo = min(n.min() for n, _ in points.values()) / 1.3
    hi = max(n.max() for n, _ in points.values()) * 1.3
    grid = np.geomspace(lo, hi, 200)
    styles = _styles(list(points))
    for arch, (n, loss) in points.items():
        line, marker = styles[arch]
        ax.scatter(n, loss, color=_color(arch), marker=marker, label=f"{_label(arch)} runs", zorder=3, s=22)
        f = fits.get(arch)
        if f is not None:
            ax.plot(
                grid,
                f(grid),
                color=_color(arch),
                lw=1.5,
                ls=line,
                label=f"{_label(arch)}: {f.E:.3f} + {f.A:.3g}·N^-{f.alpha:.3f}",
            )
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="final validation loss", title=title)
    _plain_loss_axis(ax)
    return _save(fig, ax, path)


def loss_vs_tokens(
    curves: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]], joint: dict, path: Path, title: str
) -> Path:
    """curves: (series, N) -> (tokens, val loss); joint: series -> JointLaw (drawn at each N). Each series has its
    colour and marker, each N a shade (darker = larger); every curve is in the legend, fitted or not."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    sizes = sorted({n for _, n in curves})
    shades = {n: 0.35 + 0.65 * i / max(len(sizes) - 1, 1) for i, n in enumerate(sizes)}
    styles = _styles(list({a for a, _ in curves}))
    for (arch, n), (d, loss) in sorted(curves.items()):
        color = matplotlib.colors.to_rgba(_color(arch), shades[n])
        line, marker = styles[arch]
        label = f"{_label(arch)} N={n:,.0f}"
        if joint.get(arch) is not None:
            grid = np.geomspace(d.min(), d.max(), 100)
            ax.plot(
                grid,
                joint[arch](n, grid),
                color=color,
                lw=1.2,
                ls=line,
                marker=marker,
                markevery=[],
                label=f"{label} (points: runs, line: fit)",
            )
        ax.scatter(
            d, loss, color=color, marker=marker, s=10, zorder=3, label=None if joint.get(arch) is not None else label
        )
    ax.set(xscale="log", yscale="log", xlabel="training tokens", ylabel="validation loss", title=title)
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, title="darker = larger N", title_fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_vs_compute(opt, path: Path, title: str) -> Path:
    """The Chinchilla figure: every run's final loss at its training compute C = f D (points), and each series'
    compute-optimal frontier L*(C) (line). opt: diffllm/scaling/optimal.py OptimalPlot."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    styles = _styles(list(opt.runs))
    for s, r in opt.runs.items():
        line, marker = styles[s]
        ax.scatter(r.C, r.loss, color=_color(s), marker=marker, s=16, zorder=3, alpha=0.8, label=f"{_label(s)} runs")
        fr = opt.frontiers.get(s)
        if fr is not None:
            ax.plot(fr.C, fr.loss, color=_color(s), ls=line, lw=1.5, label=f"{_label(s)}: frontier L*(C)")
    ax.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)", ylabel="final validation loss", title=title)
    _plain_loss_axis(ax)
    return _save(fig, ax, path)


def iso_flop_curves(opt, path: Path, xlabel: str, title: str) -> Path:
    """Loss vs N at a few fixed C from each series' L(N, C / f(N)) (lines, darker = more compute), the optimum on each
    (star), and each run at the C nearest its own compute (points in that C's shade: on the curve only where its
    compute is that C)."""
    series = list(opt.iso)
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 4.2), dpi=120, sharey=True, squeeze=False)
    log_c = np.log(opt.iso_C)
    shades = 0.35 + 0.65 * np.arange(len(log_c)) / max(len(log_c) - 1, 1)
    for ax, s in zip(axes[0], series):
        n, loss, best = opt.iso[s]
        r = opt.runs[s]
        nearest = np.argmin(np.abs(np.log(r.C)[:, None] - log_c[None, :]), axis=1)  # each run's nearest C
        for k, c in enumerate(opt.iso_C):
            color = matplotlib.colors.to_rgba(_color(s), shades[k])
            ax.plot(n, loss[k], color=color, lw=1.3, label=f"C = {c:.3g}")
            ax.scatter([best.N_opt[k]], [best.loss[k]], color=color, marker="*", s=70, zorder=4)
            at = nearest == k
            ax.scatter(r.N[at], r.loss[at], color=color, s=14, zorder=3)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=xlabel,
            title=_label(s),
            ylim=(None, 1.25 * max(r.loss.max(), loss[0].min())),
        )  # the curves' far ends climb without bound
        _plain_loss_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, title="lines: fit; *: optimum; points: runs", title_fontsize=6)
    axes[0][0].set_ylabel("validation loss")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
