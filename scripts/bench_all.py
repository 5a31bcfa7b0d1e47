"""`make bench`: the CPU benchmarks in one run and one summary table of the ratios diffllm tracks, with the machine and
the command in its header. Each benchmark runs as its own process (scripts/bench_data.py, bench_train.py,
bench_eval.py, bench_counts.py, bench_loss_head.py: their full tables are printed as they finish) and hands its
figures over in a JSON file.

    .venv/bin/python scripts/bench_all.py            # the full benchmarks (about 10-15 min on 2 cores)
    .venv/bin/python scripts/bench_all.py --smoke    # the same code on tiny settings, in about a minute (the test)

The counts (bench_counts.py): host syncs and collectives per plain and per logged step, 2 ranks, ZeRO-2, 2 and 8 layers,
each trainer.diagnostics level. The loss head (bench_loss_head.py): its saved-for-backward and peak bytes, chunked over
the full-logits path, at seq 2048 x micro-batch 8 (meta device). The ratios: diffllm's training step over a bare PyTorch
loop on the same model and batches (ZeRO-0, ZeRO-2); each arch's step time relative to the Transformer divided by its
FLOP ratio (1.0: as fast per FLOP); `eval ppl` tokens/s over the training step's; the data pipeline over the raw
tokenizer (wall clock, 1 and 2 processes) and over what a training step consumes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# benchmark -> (full arguments, smoke arguments)
BENCHES = {
    "bench_data.py": (
        [],
        ["--mb", "0.2", "--repeats", "1", "--seq-len", "128", "--train-seq-len", "64", "--train-steps", "1"],
    ),
    "bench_train.py": (
        [],
        [
            "--archs",
            "transformer-micro-1",
            "diff-micro-1",
            "diff2-micro-1",
            "--rounds",
            "1",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--seq-len",
            "64",
            "--micro-batch",
            "2",
        ],
    ),
    "bench_eval.py": (
        [],
        ["--model", "diff-micro-1", "--rounds", "1", "--seq-len", "64", "--batch", "4", "--train-batch", "2"],
    ),
    "bench_counts.py": ([], ["--layers", "2", "--levels", "off", "cheap"]),
    "bench_loss_head.py": (["--vocab", "50304", "100288"], ["--vocab", "50304", "--d-model", "5120"]),
}


def machine() -> str:
    """CPU model, cores, Python and torch versions."""
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "unknown CPU",
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    import torch

    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads"
    )


def run(script: str, args: list[str], out: Path) -> dict:
    """Run one benchmark (its table goes to our stdout) and return the figures it wrote."""
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print(f"\n## {script}\n$ {shlex.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def count_rows(counts: dict) -> list[tuple[str, str, str]]:
    """Host syncs and collectives per plain and per logged step, by depth and diagnostics level (bench_counts.py)."""
    where = f"ZeRO-{counts['stage']}, {counts['world_size']} ranks"
    rows = []
    for kind in ("syncs", "collectives"):  # syncs: values the host waits for (a blocking copy included)
        for step in ("plain", "logged"):
            by_depth: dict = {}
            for r in counts["rows"]:
                by_depth.setdefault(r["layers"], []).append(f"{r['diagnostics']} {r[f'{step}_{kind}']}")
            rows.append(
                (
                    f"{'host syncs' if kind == 'syncs' else 'collectives'} per {step} step, {where}",
                    "; ".join(f"{n} layers: {', '.join(v)}" for n, v in by_depth.items()),
                    "per trainer.diagnostics level, counted on CPU (scripts/bench_counts.py); the same at 2 and 8 "
                    "layers: independent of depth"
                    if kind == "syncs"
                    else "all-reduces, all-gathers and reduce-scatters of diffllm and DeepSpeed, per diagnostics level",
                )
            )
    return rows


def head_rows(head: dict) -> list[tuple[str, str, str]]:
    """The chunked loss head's saved and peak bytes over the full-logits path's (bench_loss_head.py)."""
    rows = []
    for kind in ("saved", "peak"):
        rows.append(
            (
                f"loss head {kind} bytes, chunked / full logits",
                "; ".join(
                    f"V {r['vocab']:,} E {r['d_model']}: {r[f'{kind}_chunked'] / r[f'{kind}_full']:.3f}"
                    for r in head["rows"]
                ),
                f"{'saved-for-backward' if kind == 'saved' else 'peak'} bytes of the loss head, "
                f"{head['tokens']:,} tokens, bf16 (meta device; issue target for saved: <= 0.25)",
            )
        )
    return rows


def summary(data: dict, train: dict, evals: dict, counts: dict, head: dict) -> list[tuple[str, str, str]]:
    """(ratio, value, what it measures) rows of the summary table."""
    rows = count_rows(counts) + head_rows(head)
    for stage in (0, 2):
        vals = {k.split(" | ")[0]: v for k, v in train["vs_bare"].items() if k.endswith(f"diffllm ZeRO-{stage}")}
        if vals:
            rows.append(
                (
                    f"framework / bare step, ZeRO-{stage}",
                    ", ".join(f"{p} {v:.3f}" for p, v in vals.items()),
                    "diffllm's step time over a bare torch loop's (same model, batches; 1.0 = no overhead)",
                )
            )
    base = train["baseline"]
    loop = next((k.split(" | ")[1] for k in train["per_flop_vs_baseline"] if "ZeRO-2" in k), None) or next(
        k.split(" | ")[1] for k in train["per_flop_vs_baseline"]
    )
    for key, v in train["per_flop_vs_baseline"].items():
        preset, lp = key.split(" | ")
        if lp == loop and preset != base:
            rows.append(
                (
                    f"{preset} step time / FLOP ratio to {base}",
                    f"{v:.3f}",
                    f"{lp}: step-time ratio over FLOPs-per-token ratio (1.0 = as fast per FLOP)",
                )
            )
    rows.append(
        (
            f"eval / training step ({evals['model']})",
            ", ".join(f"batch {bs} {v:.2f}x" for bs, v in evals["eval_over_train"].items()),
            "`eval ppl` tokens/s over a training step's (fwd+bwd+AdamW) on the same model and windows",
        )
    )
    for r in data["rows"]:
        rows.append(
            (
                f"data pipeline / raw tokenizer, processes {r['processes']}",
                f"{r['ratio_wall']:.2f}",
                "wall-clock tokens/s of build_train_loader over encode_batch on the same text",
            )
        )
    rows.append(
        (
            "data pipeline / training consumption",
            f"{data['pipeline_over_training']:,.0f}x",
            "1-process pipeline tokens/s over the tokens/s a diff-tiny training step consumes",
        )
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny settings: proves the benchmarks run, measures nothing")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        figures = {name: run(name, BENCHES[name][args.smoke], Path(tmp) / f"{name}.json") for name in BENCHES}
    print(
        f"\n# diffllm benchmark summary{' (smoke settings: not a measurement)' if args.smoke else ''}\n"
        f"machine: {machine()}\ncommand: {shlex.join([Path(sys.executable).name, *sys.argv])}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {time.time() - t0:.0f} s\n"
    )
    print("| ratio | value | what |\n|---|---|---|")
    for row in summary(
        figures["bench_data.py"],
        figures["bench_train.py"],
        figures["bench_eval.py"],
        figures["bench_counts.py"],
        figures["bench_loss_head.py"],
    ):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
