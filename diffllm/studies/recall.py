"""The retrieval study (configs/sweep/micro-recall*.yaml, docs/micro-retrieval.md): tables and a figure from a sweep
directory after `diffllm sweep collect` and the eval commands have run on it.

Per (series, size), the runs at the series' chosen lr: the lr with the most finished seeds (phase 1 tried four lrs
on seed 1; phase 2 ran seeds 2-5 at the lr `sweep collect select_by=recall_acc` chose, so that lr has them all). For
each: the final held-out recall accuracy (`diffllm eval recall`'s eval/recall.json where it exists, else the last
in-loop value) with a 95% t-interval over seeds, the fraction of seeds at >= 0.9, the steps to 0.5 and 0.9 (the first
in-loop evaluation at that level: median over the seeds that got there; and 0.2, from the curves), the seed-paired
difference to the Transformer, accuracy by N and by gap (eval recall's cells, mean over seeds), and the attention
probe's mass on the answer's pair per layer (`diffllm eval attention task=recall`'s attention-recall.json, mean over
seeds and cells). Writes <out>/study.md and <out>/recall_vs_step.png (the in-loop curves, mean over seeds, one panel
per size).
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..config import run_key_values
from ..errors import UserError
from ..model.registry import baseline
from ..runs import read_metrics
from ..scaling.select import size_of
from .common import LR, by_size, eval_json, fmt_ci, folder_of, reached, read_records, series_without_lr


@dataclass
class Config:
    """The retrieval study's tables and figure from a sweep after eval recall and eval attention task=recall."""

    sweep_dir: str = ""  # the sweep directory (or its collected runs.csv, whose run_dir paths hold the eval results)
    out: Optional[str] = None  # the folder for study.md and recall_vs_step.png (default: the sweep's folder)


@functools.cache
def curve(run_dir: str) -> tuple[tuple[int, float], ...]:
    """The in-loop recall accuracy by step (read once per run: the table and the plot both use it)."""
    return tuple(
        (m["step"], m["eval/recall/acc"]) for m in read_metrics(run_dir) if m.get("eval/recall/acc") is not None
    )


def chosen_runs(records) -> dict[tuple, list]:
    """(series, size) -> the finished runs at the lr with the most seeds (ties: the lower lr), sorted by seed."""
    done = [r for r in records if r.status == "finished" and r.recall_acc is not None]
    series = series_without_lr(done)
    by_lr: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in done:
        by_lr[(series[r.run_dir], size_of(r.model, r.arch))][r.axes.get(LR)].append(r)
    return {
        key: sorted(max(lrs.items(), key=lambda kv: (len(kv[1]), -(kv[0] or 0)))[1], key=lambda r: r.seed)
        for key, lrs in by_lr.items()
    }


def final_acc(r) -> float:
    ev = eval_json(r, "recall.json")
    return ev["mean"] if ev else r.recall_acc


def steps_to_level(rs, level: float) -> str:
    """The first in-loop evaluation at >= level, from each run's curve: median over the seeds that got there."""
    return reached([next((step for step, acc in curve(r.run_dir) if acc >= level), None) for r in rs], len(rs))


def main_table(chosen: dict) -> list[str]:
    lines = [
        "| series | size | lr | seeds | final recall acc [95% CI] | seeds >= 0.9 | steps to 0.5 (reached) | "
        "steps to 0.9 (reached) | steps to 0.2 (reached) | minus Transformer, seed-paired [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = baseline().arch  # the series every other is paired against (the Transformer)
    base = {size: {r.seed: final_acc(r) for r in rs} for (s, size), rs in chosen.items() if s == ref}
    has_curves = all((Path(r.run_dir) / "metrics.jsonl").is_file() for rs in chosen.values() for r in rs)
    for (series, size), rs in by_size(chosen):
        accs = [final_acc(r) for r in rs]
        paired = [final_acc(r) - base[size][r.seed] for r in rs if r.seed in base.get(size, {})]
        diff = "-" if series == ref or not paired else f"{fmt_ci(paired)} (n={len(paired)})"
        lr = rs[0].axes.get(LR)  # None: the lr is no axis (one value for every run)
        lines.append(
            f"| {series} | {size} | {'-' if lr is None else f'{lr:g}'} | {len(rs)} | {fmt_ci(accs)} | "
            f"{sum(a >= 0.9 for a in accs)}/{len(rs)} | {reached([r.recall_step_50 for r in rs], len(rs))} | "
            f"{reached([r.recall_step_90 for r in rs], len(rs))} | "
            f"{steps_to_level(rs, 0.2) if has_curves else '-'} | {diff} |"
        )
    return lines


def cell_table(chosen: dict, key: str) -> list[str]:
    """Accuracy by N (key="n") or by gap (key="gap"), mean over seeds of eval recall's per-cell accuracies (each
    cell's accuracy averaged over the other key's values, weighted by queries)."""
    table: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    values = set()
    for (series, size), rs in chosen.items():
        for r in rs:
            ev = eval_json(r, "recall.json")
            if not ev:
                continue
            hits, queries = defaultdict(float), defaultdict(int)
            for c in ev["cells"]:
                hits[c[key]] += c["accuracy"] * c["queries"]
                queries[c[key]] += c["queries"]
            for v in hits:
                values.add(v)
                table[(series, size)][v].append(hits[v] / queries[v])
    if not table:
        return []
    values = sorted(values)
    lines = ["| series | size | " + " | ".join(f"{key}={v}" for v in values) + " |", "|---|---|" + "---|" * len(values)]
    for (series, size), per in by_size(table):
        cells = [f"{statistics.mean(per[v]):.3f}" if per.get(v) else "-" for v in values]
        lines.append(f"| {series} | {size} | " + " | ".join(cells) + " |")
    return lines


def attention_table(chosen: dict) -> list[str]:
    """Attention mass on the queried pair (answer) and on the filler (noise) per layer, mean over seeds and cells."""
    rows, layers = [], 0
    for (series, size), rs in by_size(chosen):
        answer, noise = defaultdict(list), defaultdict(list)
        for r in rs:
            ev = eval_json(r, "attention-recall.json")
            for c in (ev or {}).get("cells", []):
                for layer, (a, n) in enumerate(zip(c["answer"], c["noise"])):
                    answer[layer].append(a)
                    noise[layer].append(n)
        if answer:
            layers = max(layers, len(answer))
            rows.append(
                (
                    series,
                    size,
                    [f"{statistics.mean(answer[k]):.3f} / {statistics.mean(noise[k]):.3f}" for k in sorted(answer)],
                )
            )
    if not rows:
        return []
    return [
        "| series | size | " + " | ".join(f"layer {k}: answer / noise" for k in range(layers)) + " |",
        "|---|---|" + "---|" * layers,
    ] + [
        f"| {series} | {size} | " + " | ".join(cells + ["-"] * (layers - len(cells))) + " |"
        for series, size, cells in rows
    ]


def plot(chosen: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({size for _, size in chosen})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 3.6), sharey=True, squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for (series, s), rs in sorted(chosen.items()):
            if s != size:
                continue
            curves = [dict(curve(r.run_dir)) for r in rs]
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(steps, [statistics.mean(c[t] for c in curves) for t in steps], label=f"{series} ({len(rs)})")
        ax.set_title(size)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out recall accuracy (in-loop, mean over seeds)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(c: Config) -> str:
    """Write <out>/study.md and <out>/recall_vs_step.png; returns study.md's text."""
    chosen = chosen_runs(read_records(c.sweep_dir, "sweep_dir", select=None, baselines=False))
    if not chosen:
        raise UserError(f"sweep_dir={c.sweep_dir}: no finished run with an in-loop recall accuracy")
    out = Path(c.out) if c.out else folder_of(c.sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        ["Final held-out recall accuracy per series and size at its chosen lr (95% t-intervals over seeds):", ""]
        + main_table(chosen)
    ]
    for key, what in (
        ("n", "By N (key-value pairs)"),
        ("gap", "By gap (filler words between the pairs and the queries)"),
    ):
        t = cell_table(chosen, key)
        if t:
            parts.append([f"{what}, mean over seeds of eval recall's accuracy:", ""] + t)
    t = attention_table(chosen)
    if t:
        parts.append(
            [
                "Attention probe (eval attention task=recall): mass on the queried pair / on the filler, per "
                "layer, mean over seeds and (N, gap) cells:",
                "",
            ]
            + t
        )
    text = "\n\n".join("\n".join(p) for p in parts) + "\n"
    (out / "study.md").write_text(text)
    plot(chosen, out / "recall_vs_step.png")
    print(text, end="")
    print(f"wrote {out / 'study.md'}, {out / 'recall_vs_step.png'}", file=sys.stderr)
    return text


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study recall", Config, run, argv)
