"""Training-step benchmark (not a test): diffllm's step (DeepSpeed engine, skip-step AdamW, the trainer's own
Step) against a bare PyTorch loop (DecoderLM + torch AdamW + clipping) on the same model and the same batches,
for Diff and Transformer presets of equal size. Variants run interleaved, round after round, so that a machine
whose load drifts (other jobs) hits them all alike; the medians and their ratios are printed side by side.

    .venv/bin/python scripts/bench_train.py [--rounds 4] [--steps 3] [--stages 2 0] [--seq-len 256] [--micro-batch 8]
                                            [--archs transformer-tiny diff-tiny diff2-tiny] [--json PATH]

The last table divides each preset's step-time ratio to the Transformer by its ratio of training FLOPs per token:
above 1.0, the arch runs slower per FLOP than the Transformer (its attention kernels, not its size, cost the time).

--doc-mask adds, per preset and stage, diffllm's step with data.doc_mask=true (attention within documents: an
explicit block-diagonal mask instead of the causal flag) on the same windows, and prints its step-time ratio to the
plain step. --bf16 (trainer.precision=bf16) and --compile (trainer.compile=true) do the same for the GPU code paths:
their step-time ratios to the plain (fp32, eager) step, per preset and stage. The first warm-up step of every variant
is printed too: for a compiled variant it holds inductor's compile (or its load from the on-disk cache).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", nargs="+", default=["transformer-tiny", "diff-tiny", "diff2-tiny"], help="model presets")
    p.add_argument("--stages", nargs="+", type=int, default=[2, 0], help="ZeRO stages of the diffllm variants")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (each variant once per round)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant before the first round")
    p.add_argument("--doc-mask", action="store_true", help="also time data.doc_mask=true (ratio to the plain step)")
    p.add_argument("--bf16", action="store_true", help="also time trainer.precision=bf16 (ratio to the fp32 step)")
    p.add_argument("--compile", action="store_true", help="also time trainer.compile=true (ratio to the eager step)")
    p.add_argument("--json", help="also write the figures to this file (scripts/bench_all.py reads it)")
    return p.parse_args()


def batches(seq_len: int, micro: int, n: int, doc_mask: bool = False):
    """n real Shakespeare micro-batches from the data pipeline, held in memory: both loops see the same tokens and
    neither pays for data loading (that is scripts/bench_data.py's subject); with doc_mask, with document ids."""
    import diffllm.cli.registry  # noqa: F401 - declares the commands' typed configs
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, build_train_loader, ensure_tokenizer

    data = build(DataConfig, compose("train", [f"data.seq_len={seq_len}", f"data.doc_mask={doc_mask}"]).data, "data")
    tok = ensure_tokenizer(data)
    loader = build_train_loader(data, tok, 0, 1, micro)
    out = [next(loader) for _ in range(n)]
    loader.close()
    return tok, out


class Bare:
    """The reference: nothing but the model, cross-entropy, backward, global-norm clipping and torch AdamW."""

    def __init__(self, preset: str, vocab: int, device, data):
        import torch

        from diffllm.model import DecoderLM
        from diffllm.model.presets import load_preset
        from diffllm.train.optim import param_groups

        cfg = load_preset(preset)
        cfg.vocab_size = vocab
        torch.manual_seed(0)
        self.model = DecoderLM(cfg).to(device)
        self.opt = torch.optim.AdamW(param_groups(self.model, 0.1), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        self.data, self.device, self.params = (
            itertools.cycle(data),
            device,
            sum(p.numel() for p in self.model.parameters()),
        )

    def step(self) -> None:
        import torch
        import torch.nn.functional as F

        batch = next(self.data).to(self.device)
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"):
            logits = self.model(batch.inputs)
        F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten()).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Ours:
    """diffllm's Trainer, set up as `diffllm train` does (real DeepSpeed engine), stepping with its own Step."""

    def __init__(self, preset: str, stage: int, seq_len: int, micro: int, data, run_dir: Path, extra: list[str]):
        from diffllm.config import compose
        from diffllm.train.config import TrainConfig
        from diffllm.train.loop import Trainer

        cfg = compose(
            "train",
            [
                f"model={preset}",
                f"data.seq_len={seq_len}",
                f"trainer.micro_batch_size={micro}",
                f"trainer.global_batch_tokens={micro * seq_len}",
                f"trainer.tokens={micro * seq_len * 10**6}",
                f"trainer.zero_stage={stage}",
                "trainer.val_batches=1",
                "logging.wandb=disabled",
                "optim.lr=1e-3",
                "optim.warmup_steps=0",
                "optim.schedule=constant",
                f"run_dir={run_dir}",
                *extra,
            ],
        )
        self.trainer = Trainer(TrainConfig.from_hydra(cfg))
        self.trainer.setup()
        self.trainer.step.loader = itertools.cycle(data)  # the same in-memory batches as the bare loop
        self.params = self.trainer.stats.total_params

    def step(self) -> None:
        t = self.trainer
        t.step(t.state, t.hooks, t.asks)


def main() -> None:
    args = parse()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch

    from diffllm.train.dist import init_distributed

    device = init_distributed(10.0)
    tok, data = batches(args.seq_len, args.micro_batch, 16)
    masked = batches(args.seq_len, args.micro_batch, 16, doc_mask=True)[1] if args.doc_mask else None
    # option name -> (overrides, batches) of a variant of each diffllm step, timed against the plain step
    options = {
        name: how
        for name, on, how in [
            ("doc_mask", args.doc_mask, (["data.doc_mask=true"], masked)),
            ("bf16", args.bf16, (["trainer.precision=bf16"], data)),
            ("compiled", args.compile, (["trainer.compile=true"], data)),
        ]
        if on
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    variants: dict[tuple[str, str], object] = {}
    for preset in args.archs:
        variants[(preset, "bare torch AdamW")] = Bare(preset, tok.vocab_size, device, data)
        for stage in args.stages:
            plain = ["trainer.precision=fp32"] if args.bf16 else []  # else auto: fp32 on CPUs, bf16 on GPUs
            variants[(preset, f"diffllm ZeRO-{stage}")] = Ours(
                preset, stage, args.seq_len, args.micro_batch, data, tmp / f"{preset}-z{stage}", plain
            )
            for name, (extra, batches_of) in options.items():
                variants[(preset, f"diffllm ZeRO-{stage}, {name}")] = Ours(
                    preset,
                    stage,
                    args.seq_len,
                    args.micro_batch,
                    batches_of,
                    tmp / f"{preset}-z{stage}-{name}",
                    plain + extra,
                )
    first: dict[tuple[str, str], float] = {}
    for key, v in variants.items():
        for i in range(args.warmup):
            t0 = time.perf_counter()
            v.step()
            if i == 0:
                first[key] = time.perf_counter() - t0
    times: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for key, v in variants.items():
            for _ in range(args.steps):
                t0 = time.perf_counter()
                v.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[key].append(time.perf_counter() - t0)

    tokens = args.micro_batch * args.seq_len
    med = {k: statistics.median(t) for k, t in times.items()}
    print(
        f"\ndevice {device}, torch threads {torch.get_num_threads()}, {tokens} tokens/step (micro-batch "
        f"{args.micro_batch} x seq {args.seq_len}, no accumulation), {args.rounds} rounds x {args.steps} steps, "
        f"medians; ratio = step time / bare step time of the same preset"
    )
    print("| preset | loop | params | ms/step (median) | min | tokens/s | vs bare | first warm-up step (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for (preset, loop), m in med.items():
        bare = med[(preset, "bare torch AdamW")]
        print(
            f"| {preset} | {loop} | {variants[(preset, loop)].params:,} | {1000 * m:.1f} | "
            f"{1000 * min(times[(preset, loop)]):.1f} | {tokens / m:,.0f} | {m / bare:.3f} | "
            f"{first.get((preset, loop), float('nan')):.1f} |"
        )
    if masked is not None:
        boundaries = sum(int((b.doc_ids[:, -1] > 0).sum()) for b in masked)
        print(f"\n{boundaries} of {16 * args.micro_batch} windows hold a document boundary")
    titles = {"doc_mask": "doc_mask=true / false", "bf16": "bf16 / fp32", "compiled": "compiled / eager"}
    for name in options:
        print(f"\n| preset | loop | {titles[name]} step-time ratio |\n|---|---|---|")
        for preset in args.archs:
            for stage in args.stages:
                loop = f"diffllm ZeRO-{stage}"
                print(f"| {preset} | {loop} | {med[(preset, f'{loop}, {name}')] / med[(preset, loop)]:.3f} |")
    flops = {p: flops_per_token(p, args.seq_len, tok.vocab_size) for p in args.archs}
    base = next((p for p in args.archs if p.startswith("transformer")), args.archs[0])
    loops = [k[1] for k in variants if k[0] == base]
    print(
        f"\nstep-time ratio to {base} over the FLOP ratio (training FLOPs per token, diffllm.model.accounting): 1.0 "
        f"= as fast per FLOP as the Transformer\n| preset | FLOP ratio | "
        + " | ".join(f"{loop}: step ratio, / FLOP ratio" for loop in loops)
        + " |\n|---|---|"
        + "---|" * len(loops)
    )
    for p in args.archs:
        r = flops[p] / flops[base]
        print(
            f"| {p} | {r:.3f} | "
            + " | ".join(
                f"{med[(p, lp)] / med[(base, lp)]:.3f}, {med[(p, lp)] / med[(base, lp)] / r:.3f}" for lp in loops
            )
            + " |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "tokens_per_step": tokens,
                    "baseline": base,
                    "flops_per_token": flops,
                    "ms_per_step": {f"{p} | {lp}": 1000 * m for (p, lp), m in med.items()},
                    "vs_bare": {f"{p} | {lp}": m / med[(p, "bare torch AdamW")] for (p, lp), m in med.items()},
                    "per_flop_vs_baseline": {
                        f"{p} | {lp}": med[(p, lp)] / med[(base, lp)] / (flops[p] / flops[base])
                        for p in args.archs
                        for lp in loops
                    },
                },
                indent=1,
            )
        )


def flops_per_token(preset: str, seq_len: int, vocab: int) -> float:
    """Training FLOPs per token of `preset` at `seq_len` (6 x matmul params + attention), as the trainer's MFU
    counts."""
    from diffllm.model.accounting import model_stats
    from diffllm.model.presets import load_preset

    cfg = load_preset(preset)
    cfg.vocab_size = vocab
    return model_stats(cfg, seq_len).flops_per_token


if __name__ == "__main__":
    main()
