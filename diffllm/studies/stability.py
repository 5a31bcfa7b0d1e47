"""A learning-rate stability sweep (configs/sweep/micro-stability.yaml, docs/micro-stability.md) as one table: per
series, size and learning rate (as a multiple of the smallest tried, 1x = the best lr of configs/sweep/micro.yaml),
over seeds: the final validation loss, how many runs diverged, the spike count (trainer.spikes), the largest pre-clip
grad norm, the largest block activation and attention logit of any logged step (the trainer's telemetry), and for Diff
the lowest lambda_min and how many runs took a lambda below zero. Every value comes from `sweep collect`'s records
(summary.json and metrics.jsonl of each run).

With the run directories at hand (a sweep directory, or a runs.csv whose run_dir paths exist), a second table says
where Diff's lambda goes negative: per run, the first logged step with a layer's lambda below zero, those layers, and
each layer's lambda at the end.

A run counts as diverged when it has no finite final validation loss or ends worse than the unigram baseline of its
validation windows (it has unlearned even the token frequencies).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from ..config import run_key_values
from ..errors import UserError
from ..runs import read_metrics
from ..scaling.select import size_of
from .common import LR, by_size, emit, read_records, series_without_lr


@dataclass
class Config:
    """A learning-rate stability sweep as a markdown table, and where Diff's lambda goes negative (needs the runs)."""

    sweep_dir: str = ""  # the sweep directory (collected here) or the runs.csv `sweep collect` wrote for it
    out: Optional[str] = None  # also write the tables to this file (e.g. results/micro-stability/stability.md)


def diverged(r) -> bool:
    loss = r.final_val_loss
    return loss is None or not math.isfinite(loss) or (r.unigram_loss is not None and loss > r.unigram_loss)


def _span(values: list, fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{mid:{fmt}} [{min(values):{fmt}}..{max(values):{fmt}}]"


def rows(records: list) -> list[str]:
    series = series_without_lr(records)
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:
        groups[(series[r.run_dir], size_of(r.model, r.arch))].append(r)
    lines = [
        "| series | size | lr | x best | runs | diverged | final val loss: median [min..max] | spikes | "
        "max grad norm | max activation | max attn logit | lowest λ_min | runs with λ < 0 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (series, size), runs in by_size(groups):
        base = min(r.axes[LR] for r in runs)
        by_lr: dict[float, list] = defaultdict(list)
        for r in runs:
            by_lr[r.axes[LR]].append(r)
        for lr, rs in sorted(by_lr.items()):
            lams = [r.lambda_lowest for r in rs if r.lambda_lowest is not None]
            losses = [r.final_val_loss for r in rs if not diverged(r)]
            lines.append(
                f"| {series} | {size} | {lr:g} | {lr / base:g} | {len(rs)} | {sum(map(diverged, rs))} | "
                f"{_span(losses, '.4f')} | {_span([r.spikes for r in rs], 'g')} | "
                f"{_span([r.max_grad_norm for r in rs], '.3g')} | {_span([r.act_max for r in rs], '.3g')} | "
                f"{_span([r.attn_logit_max for r in rs], '.3g')} | {f'{min(lams):.3f}' if lams else '-'} | "
                f"{sum(v < 0 for v in lams) if lams else '-'} |"
            )
    return lines


def lambda_rows(records: list) -> list[str]:
    """Per run with a per-layer lambda in its metrics.jsonl: the first logged step where one is negative."""
    lines = []
    for r in sorted(records, key=lambda r: (size_of(r.model, r.arch), r.arch, r.axes[LR], r.seed or 0)):
        logs = [m for m in read_metrics(r.run_dir) if "lambda/0" in m] if r.lambda_min is not None else []
        if not logs:
            continue
        layers = sorted((k for k in logs[-1] if k.startswith("lambda/")), key=lambda k: int(k.split("/")[1]))
        first = next(
            ((m["step"], [k.split("/")[1] for k in layers if m[k] < 0]) for m in logs if any(m[k] < 0 for k in layers)),
            None,
        )
        where = f"{first[0]} | {', '.join(first[1])}" if first else "- | -"
        lines.append(
            f"| {r.arch} | {size_of(r.model, r.arch)} | {r.axes[LR]:g} | {r.seed} | {where} | "
            + ", ".join(f"{logs[-1][k]:.3g}" for k in layers)
            + " |"
        )
    if not lines:
        return []
    return [
        "",
        "Where lambda goes negative (per-layer lambda at every logged step, metrics.jsonl):",
        "",
        "| arch | size | lr | seed | first step with a lambda < 0 | layers | lambda per layer at the end |",
        "|---|---|---|---|---|---|---|",
    ] + lines


def run(c: Config) -> str:
    """The tables as text (printed, and written to `out` when given)."""
    records = read_records(c.sweep_dir, "sweep_dir", select=None)
    unfinished = [r.run_dir for r in records if r.status != "finished"]
    if unfinished or any(LR not in r.axes for r in records):
        raise UserError(
            f"sweep_dir={c.sweep_dir}: {len(unfinished)} unfinished run(s), e.g. {unfinished[:1]}, or "
            f"runs without an {LR} axis: finish the sweep first"
        )
    text = (
        "Median [min..max] over seeds; spikes at trainer.spikes' defaults (z > 6 over a 128-step window, armed "
        "after 64 steps, action=log); diverged: no finite final validation loss, or worse than the unigram "
        "baseline (its runs are left out of the loss column).\n\n"
        + "\n".join(rows(records) + lambda_rows(records))
        + "\n"
    )
    return emit(text, c.out)


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study stability", Config, run, argv)
