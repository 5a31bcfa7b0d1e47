"""Evaluation-throughput benchmark (not a test): `eval ppl`'s batched, gradient-free forward against a training step
(forward, backward, AdamW: the bare loop of scripts/bench_train.py, which diffllm's trainer step only adds to) on the
same model and the same real Shakespeare windows. Variants run interleaved, round after round, so a machine whose load
drifts hits both alike; medians and the ratio are printed. The target: eval >= 2.5x the training step's tokens/s (a
forward is about a third of forward + backward). The last variant scores with the cross-entropy over the transposed
(B, V, T) logits that eval used before (4x slower than over (B*T, V) rows on CPU): the fix, measured side by side.

    .venv/bin/python scripts/bench_eval.py [--model diff-tiny] [--rounds 4] [--seq-len 256] [--batch 8 32] [--threads 1]
                                           [--json PATH]   (the figures, for scripts/bench_all.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="diff-tiny")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--train-batch", type=int, default=8, help="the trainer's micro-batch (configs/trainer/cpu.yaml)")
    p.add_argument("--batch", nargs="+", type=int, default=[8, 32], help="eval batch sizes to time")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: torch's default); 1 on a shared machine, "
        "where spinning intra-op threads distort every figure",
    )
    p.add_argument("--json", help="also write the figures to this file (scripts/bench_all.py reads it)")
    a = p.parse_args()

    import torch
    import torch.nn.functional as F

    if a.threads:
        torch.set_num_threads(a.threads)

    import diffllm.cli.registry  # noqa: F401 - declares the commands' typed configs
    from diffllm.config import build, compose
    from diffllm.data import Batch, DataConfig, build_val_batches, ensure_tokenizer
    from diffllm.eval.ppl import perplexity
    from diffllm.model import DecoderLM, ModelConfig

    cfg = compose("train", [f"model={a.model}", f"data.seq_len={a.seq_len}"])
    data = build(DataConfig, cfg.data, "data")
    tok = ensure_tokenizer(data)
    mcfg = build(ModelConfig, cfg.model, "model")
    mcfg.vocab_size = tok.vocab_size
    model = DecoderLM(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    windows = torch.cat([b.tokens for b in build_val_batches(data, tok, max(a.batch), 2)])  # (2 * max batch, T + 1)

    def train_step() -> int:
        model.train()
        b = windows[: a.train_batch]
        loss = F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return b[:, 1:].numel()

    def eval_pass(bs: int) -> int:
        model.eval()
        batches = [Batch(windows[i : i + bs]) for i in (0, bs)]  # every target counts
        return perplexity(model, batches)["tokens"]

    @torch.inference_mode()
    def eval_before(bs: int) -> int:  # target_logprobs as it was: cross-entropy over the (B, V, T) view
        model.eval()
        n = 0
        for i in (0, bs):
            b = windows[i : i + bs]
            logp = -F.cross_entropy(model(b[:, :-1]).float().transpose(1, 2), b[:, 1:], reduction="none")
            n += int(logp.numel())
        return n

    big = max(a.batch)
    variants = {
        "train step (fwd+bwd+AdamW)": train_step,
        **{f"eval ppl, batch {bs}": (lambda bs=bs: eval_pass(bs)) for bs in a.batch},
        f"eval before the fix (transposed cross-entropy), batch {big}": lambda: eval_before(big),
    }
    for fn in variants.values():  # warm-up
        fn()
    rates: dict = {k: [] for k in variants}
    for _ in range(a.rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t0))
    base = statistics.median(rates["train step (fwd+bwd+AdamW)"])
    print(
        f"model {a.model} ({mcfg.arch}), seq {a.seq_len}, torch threads {torch.get_num_threads()}, "
        f"{a.rounds} interleaved rounds, medians"
    )
    print("| variant | tokens/s | vs train step |\n|---|---|---|")
    for name, r in rates.items():
        print(f"| {name} | {statistics.median(r):,.0f} | {statistics.median(r) / base:.2f}x |")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "model": a.model,
                    "train_tokens_per_s": base,
                    "eval_over_train": {bs: statistics.median(rates[f"eval ppl, batch {bs}"]) / base for bs in a.batch},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
