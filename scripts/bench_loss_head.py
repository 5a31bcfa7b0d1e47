"""Loss-head memory benchmark (not a test): the unchunked head (`full_loss`: the whole (B*T, V) fp32 logits) against
diffllm's chunked head (`head_loss`, diffllm/model/loss.py) at a GPU micro-batch, counted on the meta device (no
memory, no data, seconds): bf16 hidden states and head weight of each d_model, vocab 50,304 (and the paper presets'
100,288), seq 2048, micro-batch 8.

    .venv/bin/python scripts/bench_loss_head.py [--vocab 50304 100288] [--d-model 1536 5120] [--seq-len 2048]
                                                [--micro-batch 8] [--time] [--json PATH]

saved: the bytes autograd keeps for backward (saved-tensor hooks; what scripts/../scaling/activations.py counts).
peak: the most bytes alive at once during forward + backward beyond the inputs and the weight (every op's outputs
tracked until freed; a kernel's own workspace is not seen), the weight's and the hidden states' gradients included.
--time adds a CPU timing of forward + backward at a small size, the chunked head forced to 8 chunks: the cost of its
recomputed head matmul (interleaved rounds, medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from diffllm.model import loss as loss_head  # noqa: E402
from diffllm.scaling.activations import LiveBytes, _saved_bytes  # noqa: E402

GIB = 2**30


def measure(loss, E: int, V: int, seq: int, micro: int) -> tuple[int, int]:
    """(saved bytes, peak bytes) of `loss(head, hidden, targets)` forward + backward on the meta device."""
    with torch.device("meta"):
        head = torch.nn.Linear(E, V, bias=False).to(torch.bfloat16)
        x = torch.empty(micro, seq, E, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(micro, seq, dtype=torch.long)
    saved = _saved_bytes(lambda: loss(head, x * 1.0, targets), [head.weight])  # x * 1.0: the final norm's output
    with LiveBytes() as peak:
        loss(head, x * 1.0, targets).backward()
    return saved, peak.peak


def timing(rounds: int) -> dict:
    """Forward + backward on CPU, fp32, E 256, V 8192, 4 x 512 tokens: unchunked vs 8 checkpointed chunks."""
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 8192, bias=False)
    x = torch.randn(4, 512, 256, requires_grad=True)
    targets = torch.randint(0, 8192, (4, 512))
    variants = {
        "full": lambda: loss_head.full_loss(head, x, targets),
        "chunked (8)": lambda: loss_head.head_loss(head, x, targets, chunk=256),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds + 1):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn().backward()
            if r:  # round 0 warms up
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", nargs="+", type=int, default=[50304, 100288])
    p.add_argument("--d-model", nargs="+", type=int, default=[1536, 5120], help="830M's and 13.1B's widths")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--time", action="store_true", help="also time forward + backward on CPU (small size)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()

    n = a.seq_len * a.micro_batch
    print(f"loss head, bf16, seq {a.seq_len} x micro-batch {a.micro_batch} = {n:,} tokens (meta device); GiB")
    print(
        f"{'vocab':>7} {'d_model':>7} {'chunks':>11} | {'saved full':>10} {'chunked':>8} {'ratio':>6} | "
        f"{'peak full':>9} {'chunked':>8} {'ratio':>6}"
    )
    rows = []
    for V in a.vocab:
        size = loss_head.chunk_tokens(n, V)
        for E in a.d_model:
            (fs, fp), (cs, cp) = (
                measure(loss_head.full_loss, E, V, a.seq_len, a.micro_batch),
                measure(loss_head.head_loss, E, V, a.seq_len, a.micro_batch),
            )
            chunks = f"{-(-n // size)} x {size}"
            print(
                f"{V:>7,} {E:>7} {chunks:>11} | {fs / GIB:>10.3f} {cs / GIB:>8.3f} {cs / fs:>6.3f} | "
                f"{fp / GIB:>9.3f} {cp / GIB:>8.3f} {cp / fp:>6.3f}"
            )
            rows.append(
                dict(
                    vocab=V,
                    d_model=E,
                    chunk_tokens=size,
                    saved_full=fs,
                    saved_chunked=cs,
                    peak_full=fp,
                    peak_chunked=cp,
                )
            )
    figures = {"tokens": n, "rows": rows}
    if a.time:
        t = timing(a.rounds)
        print(
            f"CPU fwd+bwd, fp32, E 256, V 8192, 2,048 tokens: full {t['full'] * 1e3:.1f} ms, chunked (8) "
            f"{t['chunked (8)'] * 1e3:.1f} ms, ratio {t['chunked (8)'] / t['full']:.2f}"
        )
        figures["cpu_ms"] = {k: v * 1e3 for k, v in t.items()}
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
