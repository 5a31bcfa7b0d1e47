"""Retrieval of a sweep's selected runs: `diffllm eval needle` (synthetic multi-needle, written to each run's eval/) on
every run at its best-of-grid value, then accuracy by number of needles per series and size, mean and min..max over
seeds, as one markdown table. The micro sweep mixes the synthetic needle source into its data (10%), so this is the
paper's multi-needle test at micro scale.

    python scripts/sweep_needle.py sweep_dir=runs/sweep/micro out=docs/micro-scaling [lengths=[128]] [trials=16]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from diffllm.eval.needle import NeedleConfig, run_needle
from diffllm.sweep.collect import collect
from diffllm.scaling.select import select_runs, size_of


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    root, out = Path(args.pop("sweep_dir")), Path(args.pop("out"))
    lengths = json.loads(args.pop("lengths", "[128]"))
    trials = int(args.pop("trials", "16"))
    if args:
        sys.exit(f"sweep_needle.py: unknown keys {sorted(args)} (keys: sweep_dir, out, lengths, trials)")
    records = collect(root, baselines=False)
    sel = select_runs(records)
    acc: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in (r for r in records if r.run_dir in sel.selected):
        res = run_needle(NeedleConfig(run=r.run_dir, lengths=lengths, trials=trials))
        for n, a in res["by_n"].items():
            acc[(sel.series[r.run_dir], size_of(r.model, r.arch))][int(n)].append(a)
    needles = sorted({n for by_n in acc.values() for n in by_n})
    lines = [f"Synthetic multi-needle accuracy (context {lengths}, {trials} trials per N x depth; chance = 1/32), "
             "runs at their best learning rate; mean [min..max] over seeds:", "",
             "| series | size | seeds | " + " | ".join(f"N={n}" for n in needles) + " |",
             "|---|---|---|" + "---|" * len(needles)]
    for (series, size), by_n in sorted(acc.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = [f"{sum(v) / len(v):.3f} [{min(v):.3f}..{max(v):.3f}]" for v in (by_n[n] for n in needles)]
        lines.append(f"| {series} | {size} | {len(by_n[needles[0]])} | " + " | ".join(cells) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "needle.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
