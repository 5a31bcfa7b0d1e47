"""Benchmark: tokens/s of the real data pipeline (streaming, packing into Batches, rank and worker sharding) against the
raw tokenizer (encode_batch) on the same text, and against what a training step consumes. Not a test; prints a
markdown table. Rows: 1 process (one rank, tokenizing in the training process), 2 processes as 2 ranks, and 2
processes as 1 rank with 2 DataLoader workers (data.num_workers=2; the raw side is 2 processes either way); tokenizer
threads are off, so one process = one core. Both wall-clock tokens/s (all processes, start to last finish) and tokens
per CPU-second (each process's own CPU time, which other jobs on a shared machine barely disturb) are reported; the
ratios are pipeline / raw. The last line: the 1-process pipeline's tokens/s over a training step's (the default
`make train` model, diff-tiny, bare forward + backward + AdamW at --seq-len): how many steps' worth of tokens one
process delivers per step time. `--json PATH` writes the figures for scripts/bench_all.py.

    .venv/bin/python scripts/bench_data.py [--mb 4] [--repeats 3] [--seq-len 1024] [--json PATH]
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def write_corpus(folder: Path, mb: float, n_files: int) -> list[str]:
    """Shakespeare's training plays cut into ~2 KB documents (paragraphs kept whole), repeated up to `mb` MB."""
    import diffllm.cli.registry  # noqa: F401 - declares the commands' typed configs
    from diffllm.config import build, compose
    from diffllm.data import DataConfig
    from diffllm.data.loader import resolve_sources

    data = build(DataConfig, compose("tokenizer").data, "data")
    paras = [p for f in resolve_sources(data)[0].files for p in Path(f).read_text().split("\n\n") if p.strip()]
    docs, cur, size = [], "", 0
    while size < mb * 1e6:
        for p in paras:
            cur += p + "\n\n"
            if len(cur) > 2000:
                docs.append(cur)
                size, cur = size + len(cur), ""
                if size >= mb * 1e6:
                    break
    for i in range(n_files):
        with open(folder / f"part-{i:02d}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs[i::n_files])
    return [d for i in range(n_files) for d in docs[i::n_files]]


def _raw(rank: int, world: int, args, barrier, out) -> None:
    from diffllm.data import load_tokenizer

    tok = load_tokenizer(args.tokenizer, "<|endoftext|>")
    docs = [json.loads(line)["text"] for f in sorted(glob.glob(f"{args.corpus}/*.jsonl")) for line in open(f)][
        rank::world
    ]
    batches, cur, chars = [], [], 0
    for d in docs:  # the same batching as the pipeline: about tokenize_chars characters per encode_batch call
        cur.append(d)
        chars += len(d)
        if chars >= 1 << 20:
            batches.append(cur)
            cur, chars = [], 0
    batches.append(cur)
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(ids) for b in batches for ids in tok.encode_batch(b))
    out.put((n, t0, time.perf_counter(), time.process_time() - c0))


def _pipeline(rank: int, world: int, args, barrier, out) -> None:
    """This rank's share of the corpus through build_train_loader: every window of every Batch it yields."""
    from diffllm.config import build
    from diffllm.data import DataConfig, build_train_loader, load_tokenizer

    tok = load_tokenizer(args.tokenizer, "<|endoftext|>")
    data = build(
        DataConfig,
        {
            "name": "bench",
            "seq_len": args.seq_len,
            "num_workers": args.workers,
            "epochs": 1,
            "sources": [{"name": "c", "path": f"{args.corpus}/*.jsonl"}],
            "prepared_dir": args.prepared,
        },
        "data",
    )
    loader = build_train_loader(data, tok, rank, world, 8)
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(batch.tokens.numel() for batch in loader)  # (B, T+1) windows
    t1 = time.perf_counter()
    loader.close()  # stops its DataLoader worker processes
    out.put((n, t0, t1, time.process_time() - c0))


def measure(fn, world: int, args) -> tuple[float, float]:
    """(tokens/s from the common start to the last end, tokens per CPU-second) of `world` processes."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=fn, args=(r, world, args, barrier, out)) for r in range(world)]
    for p in procs:
        p.start()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    tokens = sum(r[0] for r in res)
    return tokens / (max(r[2] for r in res) - min(r[1] for r in res)), tokens / sum(r[3] for r in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="corpus size in MB of text")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="best of N (the machine may be shared)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--train-seq-len", type=int, default=256, help="the training step's window (configs/data)")
    ap.add_argument("--train-steps", type=int, default=3, help="timed training steps (median)")
    ap.add_argument("--json", help="also write the figures to this file (scripts/bench_all.py reads it)")
    args = ap.parse_args()

    import datasets  # noqa: F401 - loaded once here, inherited by the forked processes

    from diffllm.config import build, compose
    from diffllm.data import DataConfig, ensure_tokenizer
    from diffllm.data.loader import resolve_sources
    from diffllm.data.prepare import prepare_source

    tok = ensure_tokenizer(build(DataConfig, compose("tokenizer").data, "data"))
    args.tokenizer = str(Path(tok.origin))
    with tempfile.TemporaryDirectory() as tmp:
        args.corpus = tmp + "/corpus"
        Path(args.corpus).mkdir()
        docs = write_corpus(Path(args.corpus), args.mb, args.files)
        data = build(
            DataConfig, {"name": "bench", "sources": [{"name": "c", "path": f"{args.corpus}/*.jsonl"}]}, "data"
        )
        prepare_source(resolve_sources(data)[0], tok, Path(tmp) / "prepared")  # also imports HF's json reader
        print(
            f"corpus: {len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} MB in {args.files} jsonl files; "
            f"tokenizer vocab {tok.vocab_size}; windows of {args.seq_len + 1}; best of {args.repeats} runs; "
            f"{os.cpu_count()} CPUs\n"
        )
        print(
            "| processes | raw tokens/s | pipeline tokens/s | ratio (wall) | raw tokens/CPU-s | pipeline tokens/CPU-s "
            "| ratio (CPU) | paired CPU ratios | prepared tokens/s |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        figures = {"rows": []}
        for label, raw_world, pipe_world, workers in ROWS:
            runs = {"raw": [], "pipe": [], "prep": []}
            for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit all three alike
                for key, fn, world, prepared in (
                    ("raw", _raw, raw_world, None),
                    ("pipe", _pipeline, pipe_world, None),
                    ("prep", _pipeline, pipe_world, tmp + "/prepared"),
                ):
                    args.prepared, args.workers = prepared, workers
                    runs[key].append(measure(fn, world, args))
            (rw, rc), (pw, pc) = (tuple(map(max, zip(*runs[k]))) for k in ("raw", "pipe"))
            paired = sorted(p[1] / r[1] for r, p in zip(runs["raw"], runs["pipe"]))
            if workers:  # DataLoader workers start from a forkserver, not as our children: their CPU time is not seen
                cpu = f"{rc:,.0f} | n/a | n/a | n/a"
            else:
                cpu = (
                    f"{rc:,.0f} | {pc:,.0f} | {pc / rc:.0%} | {paired[0]:.0%}-{paired[-1]:.0%} (median "
                    f"{paired[len(paired) // 2]:.0%})"
                )
            print(
                f"| {label} | {rw:,.0f} | {pw:,.0f} | {pw / rw:.0%} | {cpu} | {max(q[0] for q in runs['prep']):,.0f} |",
                flush=True,
            )
            figures["rows"].append(
                {
                    "processes": label,
                    "raw_tokens_per_s": rw,
                    "pipeline_tokens_per_s": pw,
                    "ratio_wall": pw / rw,
                    "ratio_cpu": None if workers else pc / rc,
                }
            )
    step_rate = training_tokens_per_s(args.train_seq_len, args.train_steps)
    one = figures["rows"][0]["pipeline_tokens_per_s"]
    figures.update(train_tokens_per_s=step_rate, pipeline_over_training=one / step_rate)
    print(
        f"\ntraining step (diff-tiny, seq {args.train_seq_len}, micro-batch 8, bare fwd+bwd+AdamW): "
        f"{step_rate:,.0f} tokens/s; 1-process pipeline / training consumption: {one / step_rate:,.1f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


# (label, raw tokenizer processes, pipeline ranks, DataLoader workers per rank)
ROWS = (("1", 1, 1, 0), ("2: 2 ranks", 2, 2, 0), ("2: 1 rank, 2 workers", 2, 1, 2))


def training_tokens_per_s(seq_len: int, steps: int) -> float:
    """Tokens/s a training step of the default model consumes: bench_train.py's bare loop (the floor of diffllm's
    step), median of `steps` timed steps after one warm-up, on real windows."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from bench_train import Bare, batches

    tok, data = batches(seq_len, 8, steps + 1)
    bare = Bare("diff-tiny", tok.vocab_size, torch.device("cpu"), data)
    bare.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        bare.step()
        times.append(time.perf_counter() - t0)
    return 8 * seq_len / statistics.median(times)


if __name__ == "__main__":
    main()
