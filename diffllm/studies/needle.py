"""Retrieval of a sweep's selected runs: `diffllm eval needle` (synthetic multi-needle, written to each run's eval/) on
every run at its best-of-grid value, then accuracy by number of needles per series and size, mean and min..max over
seeds, as one markdown table (<out>/needle.md). The micro sweep mixes the synthetic needle source into its data (10%),
so this is the paper's multi-needle test at micro scale (docs/micro-scaling.md)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import run_key_values
from ..errors import UserError
from ..eval.config import NeedleConfig
from ..scaling.select import select_runs, size_of
from .common import by_size, emit, folder_of, read_records


@dataclass
class Config:
    """Eval needle (synthetic) on a sweep's runs at their best-of-grid value: accuracy by number of needles (table)."""

    sweep_dir: str = ""  # the sweep directory (or its collected runs.csv, whose run_dir paths hold the runs)
    out: Optional[str] = None  # the folder for needle.md (default: the sweep's folder)
    lengths: list[int] = field(default_factory=lambda: [128])  # context lengths (tokens) of eval needle
    trials: int = 16  # trials per number of needles x depth


def run(c: Config) -> str:
    """Evaluate the selected runs (each run's eval/ gets eval needle's results) and write <out>/needle.md."""
    from ..eval.needle import run_needle

    records = read_records(c.sweep_dir, "sweep_dir", baselines=False)
    sel = select_runs(records)
    acc: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in (r for r in records if r.run_dir in sel.selected):
        res = run_needle(NeedleConfig(run=r.run_dir, lengths=c.lengths, trials=c.trials))
        for n, a in res["by_n"].items():
            acc[(sel.series[r.run_dir], size_of(r.model, r.arch))][int(n)].append(a)
    if not acc:
        raise UserError(f"sweep_dir={c.sweep_dir}: no finished run at a best-of-grid value to evaluate")
    needles = sorted({n for by_n in acc.values() for n in by_n})
    lines = [
        f"Synthetic multi-needle accuracy (context {c.lengths}, {c.trials} trials per N x depth; chance = 1/32), "
        "runs at their best learning rate; mean [min..max] over seeds:",
        "",
        "| series | size | seeds | " + " | ".join(f"N={n}" for n in needles) + " |",
        "|---|---|---|" + "---|" * len(needles),
    ]
    for (series, size), by_n in by_size(acc):
        cells = [f"{sum(v) / len(v):.3f} [{min(v):.3f}..{max(v):.3f}]" for v in (by_n[n] for n in needles)]
        lines.append(f"| {series} | {size} | {len(by_n[needles[0]])} | " + " | ".join(cells) + " |")
    out = Path(c.out) if c.out else folder_of(c.sweep_dir)
    return emit("\n".join(lines) + "\n", out / "needle.md")


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study needle", Config, run, argv)
