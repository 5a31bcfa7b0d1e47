"""Tables and figures of evaluation results: markdown tables, the needle heatmap (as in the paper's figure), bars."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def markdown(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    def fmt(x) -> str:
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows])


def _grid(res: dict, n: int) -> tuple[list, list, list]:
    cells = [c for c in res["cells"] if c["n"] == n]
    depths = sorted({c["depth"] for c in cells})
    lengths = sorted({c["length"] for c in cells})
    acc = {(c["depth"], c["length"]): c["accuracy"] for c in cells}
    return depths, lengths, [[acc[(d, x)] for x in lengths] for d in depths]


def needle_table(res: dict) -> str:
    """Rows N x depth, columns context length; the last column is the row mean."""
    blocks = []
    for n in sorted({c["n"] for c in res["cells"]}):
        depths, lengths, grid = _grid(res, n)
        rows = [[n, f"{d:g}%"] + row + [sum(row) / len(row)] for d, row in zip(depths, grid)]
        blocks.append(rows)
    header = ["N", "depth"] + [str(x) for x in _grid(res, res["cells"][0]["n"])[1]] + ["mean"]
    return markdown(header, [r for b in blocks for r in b])


def short_path(path: str, limit: int = 48) -> str:
    """`path` whole, or its last parts behind ".../" when it is longer than `limit` characters (a sweep run's
    `.../diff-micro-1/lr=0.008,lambda_init=0.8/seed1`)."""
    if len(path) <= limit:
        return path
    parts = Path(path).parts
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + len(kept) + 5 > limit:
            break
        kept = f"{part}/{kept}"
    return f".../{kept}"


def heatmap_title(res: dict) -> str:
    """The run (its path: runs of one preset in a sweep differ there), then preset, arch, step and mode."""
    what = f"{res.get('model', '')} ({res.get('arch', '')}), step {res.get('step', '')}: {res.get('mode', '')} needles"
    return f"{short_path(str(res['run']))}\n{what}" if res.get("run") else what


def needle_heatmap(res: dict, path: Path) -> None:
    """One panel per N: depth (rows, 0% at the top) x context length (columns), green = retrieved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({c["n"] for c in res["cells"]})
    fig, axes = plt.subplots(1, len(ns), figsize=(3.2 * len(ns) + 1, 3.2), squeeze=False)
    for ax, n in zip(axes[0], ns):
        depths, lengths, grid = _grid(res, n)
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(x) for x in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths], fontsize=7)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(f"N={n}, R={min(res.get('queries', 1), n)}", fontsize=9)
        for i, row in enumerate(grid):
            for j, a in enumerate(row):
                ax.text(j, i, f"{a:.2f}", ha="center", va="center", fontsize=6)
    axes[0][0].set_ylabel("answer needle depth")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    fig.suptitle(heatmap_title(res), fontsize=10, y=1.0, va="bottom")  # above the panel titles, not over them
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
