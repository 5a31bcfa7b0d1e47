"""Two collected sweeps side by side on the points they share: the same series (arch + axes), size, budget and seed.
Made for a schedule control (configs/sweep/micro-branch-control.yaml: linear-schedule runs from scratch at some of
configs/sweep/micro-branch.yaml's points, which WSD branches trained), usable for any two sweeps of one grid.

Per (series, size, budget): the mean loss over the shared seeds in each sweep, the seed spread of each (max - min), and
the paired difference a - b (seed by seed: same data order, same initialisation) as mean [min..max]. Then, per (size,
budget), the series ranked by mean loss in each sweep, and whether the order is the same. Each sweep's series are
taken at their best-of-grid value of `select` (default optim.lr), as `sweep collect` marks them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..config import run_key_values
from ..errors import UserError
from ..scaling.select import select_runs, size_of
from .common import LR, emit, read_records


@dataclass
class Config:
    """Two collected sweeps on the points both trained: paired differences, seed spreads and rankings (markdown)."""

    a: str = ""  # one sweep: its directory (collected here) or the runs.csv `sweep collect` wrote for it
    b: str = ""  # the other sweep, likewise
    loss: str = "final_val_loss"  # the loss compared: final_val_loss | final_train_loss
    select: str = LR  # the axis whose best-of-grid value each series is taken at (as `sweep collect` marks it)
    out: Optional[str] = None  # also write the table to this file (e.g. results/micro-branch/control/compare.md)

    def validate(self) -> None:
        if self.loss not in ("final_val_loss", "final_train_loss"):
            raise UserError(f"compare.loss={self.loss}: expected final_val_loss or final_train_loss")


def points(source: str, key: str, loss: str, select: str) -> dict[tuple, float]:
    """{(series, size, tokens, seed): loss} of the finished runs at their group's selected value."""
    records = read_records(source, key, select=select, baselines=False)
    sel = select_runs(records, select, loss)
    out = {}
    for r in records:
        value = getattr(r, loss)
        if r.run_dir in sel.selected and r.status == "finished" and value is not None:
            out[(sel.series[r.run_dir], size_of(r.model, r.arch), r.tokens, r.seed)] = value
    return out


def table(a: dict, b: dict, names: tuple[str, str]) -> list[str]:
    shared = sorted(set(a) & set(b), key=lambda k: (k[1], k[2], k[0], k[3]))
    groups: dict[tuple, list] = defaultdict(list)
    for key in shared:
        groups[key[:3]].append((a[key], b[key]))
    na, nb = names
    lines = [
        f"| series | size | tokens | seeds | {na} mean | {na} spread | {nb} mean | {nb} spread | "
        f"{na} - {nb}: mean [min..max] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (series, size, tokens), pairs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        xa, xb = [p[0] for p in pairs], [p[1] for p in pairs]
        d = [p - q for p, q in pairs]
        lines.append(
            f"| {series} | {size} | {tokens:,} | {len(pairs)} | {sum(xa) / len(xa):.4f} | "
            f"{max(xa) - min(xa):.4f} | {sum(xb) / len(xb):.4f} | {max(xb) - min(xb):.4f} | "
            f"{sum(d) / len(d):+.4f} [{min(d):+.4f}..{max(d):+.4f}] |"
        )
    lines += [
        "",
        f"| size | tokens | ranking in {na} (best first) | ranking in {nb} | same order |",
        "|---|---|---|---|---|",
    ]
    by_point: dict[tuple, dict] = defaultdict(dict)
    for (series, size, tokens), pairs in groups.items():
        by_point[(size, tokens)][series] = (
            sum(p[0] for p in pairs) / len(pairs),
            sum(p[1] for p in pairs) / len(pairs),
        )
    for (size, tokens), means in sorted(by_point.items()):
        ra = sorted(means, key=lambda s: means[s][0])
        rb = sorted(means, key=lambda s: means[s][1])
        lines.append(f"| {size} | {tokens:,} | {' < '.join(ra)} | {' < '.join(rb)} | {'yes' if ra == rb else 'no'} |")
    return lines


def run(c: Config) -> str:
    """The comparison as text (printed, and written to `out` when given)."""
    pa, pb = points(c.a, "a", c.loss, c.select), points(c.b, "b", c.loss, c.select)
    if not set(pa) & set(pb):
        raise UserError(f"a={c.a} and b={c.b} share no (series, size, tokens, seed) point")
    names = tuple(p.parent.name if p.is_file() else p.name for p in (Path(c.a), Path(c.b)))
    lines = [f"{c.loss}: a = {c.a}, b = {c.b}; the points both sweeps trained", ""]
    text = "\n".join(lines + table(pa, pb, names if names[0] != names[1] else ("a", "b"))) + "\n"
    return emit(text, c.out)


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study compare", Config, run, argv)
