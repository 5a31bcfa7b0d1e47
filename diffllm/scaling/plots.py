"""Scaling plots (matplotlib, PNG, log axes): final loss vs parameters with the L(N) fits, and validation loss vs
tokens (learning curves) with the L(N, D) fit at each size; every arch side by side in each figure, in the label and
colour its attention variant carries (diffllm/model/variant.py)."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..model.variant import variants  # noqa: E402


def _color(arch: str) -> str:
    v = variants().get(arch)
    return v.color if v else "k"


def _label(arch: str) -> str:
    v = variants().get(arch)
    return v.label if v else arch


def _plain_loss_axis(ax) -> None:
    """Log-scaled loss axis with plain numbers (4.5, not 4.5 x 10^0)."""
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))


def loss_vs_params(points: dict[str, tuple[np.ndarray, np.ndarray]], fits: dict, path: Path, xlabel: str,
                   title: str) -> Path:
    """points: arch -> (N, loss); fits: arch -> PowerLaw."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    lo = min(n.min() for n, _ in points.values()) / 1.3
    hi = max(n.max() for n, _ in points.values()) * 1.3
    grid = np.geomspace(lo, hi, 200)
    for arch, (n, loss) in points.items():
        ax.scatter(n, loss, color=_color(arch), label=f"{_label(arch)} runs", zorder=3, s=22)
        f = fits.get(arch)
        if f is not None:
            ax.plot(grid, f(grid), color=_color(arch), lw=1.5,
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
    """curves: (arch, N) -> (tokens, val loss); joint: arch -> JointLaw (drawn at each N)."""
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    sizes = sorted({n for _, n in curves})
    shades = {n: 0.35 + 0.65 * i / max(len(sizes) - 1, 1) for i, n in enumerate(sizes)}
    for (arch, n), (d, loss) in sorted(curves.items()):
        color = matplotlib.colors.to_rgba(_color(arch), shades[n])
        ax.scatter(d, loss, color=color, s=10, zorder=3)
        if joint.get(arch) is not None:
            grid = np.geomspace(d.min(), d.max(), 100)
            ax.plot(grid, joint[arch](n, grid), color=color, lw=1.2, label=f"{_label(arch)} N={n:,.0f}")
    ax.set(xscale="log", yscale="log", xlabel="training tokens", ylabel="validation loss", title=title)
    _plain_loss_axis(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
