"""Decode benchmark (not a test): KV-cached greedy decoding speed and the bytes the cache really holds, for MHA, GQA,
MLA, Diff and Diff V2 presets side by side, at several context lengths. Each (preset, context) prefills a random
prompt of `context` tokens, then decodes `--new-tokens` one at a time through the cache; the presets run interleaved,
round after round, so a machine whose load drifts hits them all alike; medians over rounds, and ratios to the first
preset (MHA).

    .venv/bin/python scripts/bench_generate.py [--presets transformer-tiny transformer-tiny-gqa mla-tiny diff-tiny
        diff2-tiny] [--contexts 64 192 448] [--new-tokens 32] [--rounds 5] [--batch 1] [--dtype float32]
        [--threads 1] [--json PATH]

"cache B/token" is measured: the bytes of every tensor the KVCache holds after decoding, per cached position of one
sequence, in --dtype; "declared bf16" is the variant's own declaration (`diffllm info`'s KV bytes/token), which the
measured figure equals at --dtype bfloat16 and doubles at float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = ["transformer-tiny", "transformer-tiny-gqa", "mla-tiny", "diff-tiny", "diff2-tiny"]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=PRESETS, help="model presets; the first is the ratios' reference")
    p.add_argument("--contexts", nargs="+", type=int, default=[64, 192, 448], help="prompt lengths before decoding")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens decoded one at a time (timed)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each preset and context once per round)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: a tiny decode step is latency-bound)")
    p.add_argument("--json", help="also write the figures to this file")
    return p.parse_args(argv)


def build(preset: str, dtype):
    import torch

    from diffllm.model import DecoderLM
    from diffllm.model.presets import load_preset

    cfg = load_preset(preset)
    torch.manual_seed(0)
    return DecoderLM(cfg).to(dtype).eval()


def decode(model, context: int, new: int, batch: int) -> tuple[float, float]:
    """(seconds for `new` cached decode steps after a `context`-token prefill, cache bytes per position)."""
    import torch

    from diffllm.model import KVCache

    cache = KVCache(max_len=context + new)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(context))
    with torch.no_grad():
        nxt = model(prompt, cache)[:, -1:].argmax(-1)  # prefill (untimed)
        start = time.perf_counter()
        for _ in range(new):
            nxt = model(nxt, cache)[:, -1:].argmax(-1)  # (B, 1)
        seconds = time.perf_counter() - start
    held = sum(t.nbytes for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor))
    return seconds, held / (batch * cache.max_len)


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    from diffllm.model.accounting import kv_cache_bytes_per_token

    torch.set_num_threads(args.threads)  # more threads than free cores made every step 10x slower on a shared CPU
    dtype = getattr(torch, args.dtype)
    models = {p: build(p, dtype) for p in args.presets}
    for p, m in models.items():  # every context must fit the model
        if max(args.contexts) + args.new_tokens > m.cfg.max_seq_len:
            sys.exit(f"bench_generate: --contexts {max(args.contexts)} + --new-tokens exceeds {p}'s max_seq_len")
        decode(m, min(args.contexts), 2, args.batch)  # warm-up
    times: dict[tuple, list[float]] = {(p, c): [] for p in args.presets for c in args.contexts}
    measured: dict[tuple, float] = {}
    for _ in range(args.rounds):
        for c in args.contexts:
            for p, m in models.items():
                seconds, measured[p, c] = decode(m, c, args.new_tokens, args.batch)
                times[p, c].append(seconds)
    rows = []
    for c in args.contexts:
        ref = args.new_tokens * args.batch / statistics.median(times[args.presets[0], c])
        for p, m in models.items():
            tps = args.new_tokens * args.batch / statistics.median(times[p, c])
            rows.append(
                {
                    "preset": p,
                    "arch": m.cfg.arch,
                    "context": c,
                    "tokens_per_s": tps,
                    "ratio": tps / ref,
                    "cache_bytes_per_token": measured[p, c],
                    "declared_bf16": kv_cache_bytes_per_token(m.cfg),
                    "cache_mib": measured[p, c] * (c + args.new_tokens) * args.batch / 2**20,
                }
            )
    return rows


def table(rows: list[dict], args: argparse.Namespace) -> str:
    ref = rows[0]["preset"]
    lines = [
        f"| preset | arch | context | decode tokens/s | ratio to {ref} | cache B/token ({args.dtype}) | "
        f"declared bf16 B/token | cache MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['arch']} | {r['context']} | {r['tokens_per_s']:.1f} | {r['ratio']:.2f} | "
            f"{r['cache_bytes_per_token']:,.0f} | {r['declared_bf16']:,} | {r['cache_mib']:.3f} |"
        )
    lines.append(
        f"(medians of {args.rounds} interleaved rounds of {args.new_tokens} decode steps, batch {args.batch}, "
        f"{args.threads} thread(s); cache MiB at context + new tokens)"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse(argv)
    rows = run(args)
    print(table(rows, args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
