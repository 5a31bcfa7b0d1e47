"""Scaling plots (matplotlib, PNG, log axes): final loss vs parameters with the L(N) fits, and validation loss vs
tokens (learning curves) with the L(N, D) fit at each size; every series side by side in each figure, in the label and
colour its attention variant carries (diffllm/model/variant.py). A series is an arch or an arch with axis values
(`diff λ_init=0.8`): series of one arch share its colour and differ in line style and marker."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..model.variant import variants  # noqa: E402


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


def loss_vs_params(points: dict[str, tuple[np.ndarray, np.ndarray]], fits: dict, path: Path, xlabel: str,
                   title: str) -> Path:
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
            ax.plot(grid, f(grid), color=_color(arch), lw=1.5, ls=line,
                    label=f"{_label(arch)}: {f.E:.3f} + {f.A:.3g}·N^-{f.alpha:.3f}")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="final validation loss", title=title)
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_vs_tokens(curves: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]], joint: dict, path: Path,
                   title: str) -> Path:
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
            ax.plot(grid, joint[arch](n, grid), color=color, lw=1.2, ls=line, marker=marker, markevery=[],
                    label=f"{label} (points: runs, line: fit)")
        ax.scatter(d, loss, color=color, marker=marker, s=10, zorder=3,
                   label=None if joint.get(arch) is not None else label)
    ax.set(xscale="log", yscale="log", xlabel="training tokens", ylabel="validation loss", title=title)
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, title="darker = larger N", title_fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
