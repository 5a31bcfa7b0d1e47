"""The retrieval study's tables and figure (configs/sweep/micro-recall*.yaml, docs/micro-retrieval.md), from a sweep
directory after `diffllm sweep collect` and the eval commands have run on it:

    python scripts/recall_study.py sweep_dir=runs/sweep/micro-recall [out=docs/micro-retrieval]

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
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from diffllm.runs import read_json, read_metrics
from diffllm.scaling.select import series_label, size_of
from diffllm.sweep.collect import collect

LR = "optim.lr"
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # two-sided 95%


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval over seeds (a point with one seed has no interval: nan)."""
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def fmt_ci(xs: list[float], digits: int = 3) -> str:
    m, lo, hi = t_interval(xs)
    return f"{m:.{digits}f}" if math.isnan(lo) else f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def eval_json(r, name: str) -> dict | None:
    """<run>/eval/<name>, or None where the eval command has not run on it."""
    path = Path(r.run_dir) / "eval" / name
    return read_json(path) if path.is_file() else None


@functools.lru_cache(maxsize=None)
def curve(run_dir: str) -> tuple[tuple[int, float], ...]:
    """The in-loop recall accuracy by step (read once per run: the table and the plot both use it)."""
    return tuple((m["step"], m["eval/recall/acc"]) for m in read_metrics(run_dir)
                 if m.get("eval/recall/acc") is not None)


def chosen_runs(records) -> dict[tuple, list]:
    """(series, size) -> the finished runs at the lr with the most seeds (ties: the lower lr), sorted by seed."""
    done = [r for r in records if r.status == "finished" and r.recall_acc is not None]
    archs = defaultdict(list)
    for r in done:
        archs[r.arch].append(r)
    by_lr: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for arch, rs in archs.items():
        varying = [k for k in sorted({k for r in rs for k in r.axes}) if k != LR
                   and len({repr(r.axes.get(k)) for r in rs}) > 1]
        for r in rs:
            by_lr[(series_label(r, varying), size_of(r.model, r.arch))][r.axes.get(LR)].append(r)
    return {key: sorted(max(lrs.items(), key=lambda kv: (len(kv[1]), -(kv[0] or 0)))[1], key=lambda r: r.seed)
            for key, lrs in by_lr.items()}


def final_acc(r) -> float:
    ev = eval_json(r, "recall.json")
    return ev["mean"] if ev else r.recall_acc


def steps_to(rs, field: str) -> str:
    got = [getattr(r, field) for r in rs if getattr(r, field) is not None]
    return f"{statistics.median(got):.0f} ({len(got)}/{len(rs)})" if got else f"- (0/{len(rs)})"


def steps_to_level(rs, level: float) -> str:
    """The first in-loop evaluation at >= level, from each run's curve: median over the seeds that got there."""
    got = [next((step for step, acc in curve(r.run_dir) if acc >= level), None) for r in rs]
    got = [g for g in got if g is not None]
    return f"{statistics.median(got):.0f} ({len(got)}/{len(rs)})" if got else f"- (0/{len(rs)})"


def main_table(chosen: dict) -> list[str]:
    lines = ["| series | size | lr | seeds | final recall acc [95% CI] | seeds >= 0.9 | steps to 0.5 (reached) | "
             "steps to 0.9 (reached) | steps to 0.2 (reached) | minus Transformer, seed-paired [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = {size: {r.seed: final_acc(r) for r in rs} for (s, size), rs in chosen.items() if s == "transformer"}
    has_curves = all((Path(r.run_dir) / "metrics.jsonl").is_file() for rs in chosen.values() for r in rs)
    for (series, size), rs in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        accs = [final_acc(r) for r in rs]
        paired = [final_acc(r) - base[size][r.seed] for r in rs if r.seed in base.get(size, {})]
        diff = "-" if series == "transformer" or not paired else f"{fmt_ci(paired)} (n={len(paired)})"
        lr = rs[0].axes.get(LR)  # None: the lr is no axis (one value for every run)
        lines.append(f"| {series} | {size} | {'-' if lr is None else f'{lr:g}'} | {len(rs)} | {fmt_ci(accs)} | "
                     f"{sum(a >= 0.9 for a in accs)}/{len(rs)} | {steps_to(rs, 'recall_step_50')} | "
                     f"{steps_to(rs, 'recall_step_90')} | {steps_to_level(rs, 0.2) if has_curves else '-'} | {diff} |")
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
    lines = [f"| series | size | " + " | ".join(f"{key}={v}" for v in values) + " |",
             "|---|---|" + "---|" * len(values)]
    for (series, size), per in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = [f"{statistics.mean(per[v]):.3f}" if per.get(v) else "-" for v in values]
        lines.append(f"| {series} | {size} | " + " | ".join(cells) + " |")
    return lines


def attention_table(chosen: dict) -> list[str]:
    """Attention mass on the queried pair (answer) and on the filler (noise) per layer, mean over seeds and cells."""
    rows, layers = [], 0
    for (series, size), rs in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        answer, noise = defaultdict(list), defaultdict(list)
        for r in rs:
            ev = eval_json(r, "attention-recall.json")
            for c in (ev or {}).get("cells", []):
                for layer, (a, n) in enumerate(zip(c["answer"], c["noise"])):
                    answer[layer].append(a)
                    noise[layer].append(n)
        if answer:
            layers = max(layers, len(answer))
            rows.append((series, size, [f"{statistics.mean(answer[k]):.3f} / {statistics.mean(noise[k]):.3f}"
                                        for k in sorted(answer)]))
    if not rows:
        return []
    return ([f"| series | size | " + " | ".join(f"layer {k}: answer / noise" for k in range(layers)) + " |",
             "|---|---|" + "---|" * layers]
            + [f"| {series} | {size} | " + " | ".join(cells + ["-"] * (layers - len(cells))) + " |"
               for series, size, cells in rows])


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


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    unknown = set(args) - {"sweep_dir", "out"}
    if unknown or "sweep_dir" not in args:
        sys.exit(f"usage: recall_study.py sweep_dir=DIR [out=DIR] (got {' '.join(argv) or 'nothing'})")
    root = Path(args["sweep_dir"])
    if not root.is_dir():
        sys.exit(f"recall_study.py: sweep_dir={root}: no such directory")
    chosen = chosen_runs(collect(root, select=None, baselines=False))
    if not chosen:
        sys.exit(f"recall_study.py: sweep_dir={root}: no finished run with an in-loop recall accuracy")
    out = Path(args.get("out", root))
    out.mkdir(parents=True, exist_ok=True)
    parts = [["Final held-out recall accuracy per series and size at its chosen lr (95% t-intervals over seeds):", ""]
             + main_table(chosen)]
    for key, what in (("n", "By N (key-value pairs)"), ("gap", "By gap (filler words between the pairs and the "
                                                              "queries)")):
        t = cell_table(chosen, key)
        if t:
            parts.append([f"{what}, mean over seeds of eval recall's accuracy:", ""] + t)
    t = attention_table(chosen)
    if t:
        parts.append(["Attention probe (eval attention task=recall): mass on the queried pair / on the filler, per "
                      "layer, mean over seeds and (N, gap) cells:", ""] + t)
    text = "\n\n".join("\n".join(p) for p in parts) + "\n"
    (out / "study.md").write_text(text)
    plot(chosen, out / "recall_vs_step.png")
    print(text, end="")
    print(f"wrote {out / 'study.md'}, {out / 'recall_vs_step.png'}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
