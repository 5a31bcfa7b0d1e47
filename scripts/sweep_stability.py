"""A learning-rate stability sweep (configs/sweep/micro-stability.yaml) as one table: per series, size and learning
rate (as a multiple of the smallest tried, 1x = the best lr of configs/sweep/micro.yaml), over seeds: the final
validation loss, how many runs diverged, the spike count (trainer.spikes), the largest pre-clip grad norm, the largest
block activation and attention logit of any logged step (the trainer's telemetry), and for Diff the lowest lambda_min
and how many runs took a lambda below zero. Every value comes from `sweep collect`'s records (summary.json and
metrics.jsonl of each run).

    python scripts/sweep_stability.py sweep_dir=runs/sweep/micro-stability [out=docs/micro-stability/stability.md]
    python scripts/sweep_stability.py sweep_dir=docs/micro-stability/runs.csv   # the table `sweep collect` wrote

With the run directories at hand (a sweep directory, or a runs.csv whose run_dir paths exist), a second table says
where Diff's lambda goes negative: per run, the first logged step with a layer's lambda below zero, those layers, and
each layer's lambda at the end.

A run counts as diverged when it has no finite final validation loss or ends worse than the unigram baseline of its
validation windows (it has unlearned even the token frequencies).
"""
from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from diffllm.results import read_csv
from diffllm.runs import read_metrics
from diffllm.scaling.select import series_label, size_of
from diffllm.sweep.collect import collect

LR = "optim.lr"


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
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:  # series: the arch and its axes other than the learning rate that vary (as sweep collect's)
        varying = [k for k in sorted(r.axes) if k != LR and len({repr(q.axes.get(k)) for q in records
                                                                 if q.arch == r.arch}) > 1]
        groups[(series_label(r, varying), size_of(r.model, r.arch))].append(r)
    lines = ["| series | size | lr | x best | runs | diverged | final val loss: median [min..max] | spikes | "
             "max grad norm | max activation | max attn logit | lowest λ_min | runs with λ < 0 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (series, size), runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
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
                f"{sum(v < 0 for v in lams) if lams else '-'} |")
    return lines


def lambda_rows(records: list) -> list[str]:
    """Per run with a per-layer lambda in its metrics.jsonl: the first logged step where one is negative."""
    lines = []
    for r in sorted(records, key=lambda r: (size_of(r.model, r.arch), r.arch, r.axes[LR], r.seed or 0)):
        logs = [m for m in read_metrics(r.run_dir) if "lambda/0" in m] if r.lambda_min is not None else []
        if not logs:
            continue
        layers = sorted((k for k in logs[-1] if k.startswith("lambda/")), key=lambda k: int(k.split("/")[1]))
        first = next(((m["step"], [k.split("/")[1] for k in layers if m[k] < 0]) for m in logs
                      if any(m[k] < 0 for k in layers)), None)
        where = f"{first[0]} | {', '.join(first[1])}" if first else "- | -"
        lines.append(f"| {r.arch} | {size_of(r.model, r.arch)} | {r.axes[LR]:g} | {r.seed} | {where} | "
                     + ", ".join(f"{logs[-1][k]:.3g}" for k in layers) + " |")
    if not lines:
        return []
    return ["", "Where lambda goes negative (per-layer lambda at every logged step, metrics.jsonl):", "",
            "| arch | size | lr | seed | first step with a lambda < 0 | layers | lambda per layer at the end |",
            "|---|---|---|---|---|---|---|"] + lines


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv if "=" in a)
    if set(args) - {"sweep_dir", "out"} or "sweep_dir" not in args or len(args) != len(argv):
        sys.exit("usage: sweep_stability.py sweep_dir=<dir> [out=<file.md>]")
    source = Path(args["sweep_dir"])
    if not source.exists():
        sys.exit(f"sweep_stability.py: {source} does not exist (give a sweep directory or its collected runs.csv)")
    records = read_csv(source) if source.is_file() else collect(source, select=None)
    unfinished = [r.run_dir for r in records if r.status != "finished"]
    if unfinished or any(LR not in r.axes for r in records):
        sys.exit(f"sweep_stability.py: {len(unfinished)} unfinished run(s), e.g. {unfinished[:1]}, or runs without "
                 f"an {LR} axis: finish the sweep first")
    text = ("Median [min..max] over seeds; spikes at trainer.spikes' defaults (z > 6 over a 128-step window, armed "
            "after 64 steps, action=log); diverged: no finite final validation loss, or worse than the unigram "
            "baseline (its runs are left out of the loss column).\n\n" + "\n".join(rows(records) + lambda_rows(records))
            + "\n")
    if "out" in args:
        Path(args["out"]).parent.mkdir(parents=True, exist_ok=True)
        Path(args["out"]).write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
