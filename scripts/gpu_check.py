"""GPU checks in one run (installs nothing; torch only): backend agreement in bf16 and fwd+bwd throughput and MFU of
Transformer vs Diff at a paper preset. `GPU_CHECK_SMOKE=1` runs the same code on CPU with tiny models."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diffllm.hardware import peak_tflops  # noqa: E402
from diffllm.model import DecoderLM, ModelConfig  # noqa: E402
from diffllm.model.accounting import model_stats  # noqa: E402
from diffllm.model.kernels import flash_available  # noqa: E402
from diffllm.model.presets import load_preset  # noqa: E402
from diffllm.model.registry import variants  # noqa: E402

SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = torch.float32 if SMOKE else torch.bfloat16


def preset(name: str, **overrides) -> ModelConfig:
    return dataclasses.replace(load_preset(name), **overrides)


def agreement(arch: str) -> dict[str, float]:
    """Max |logit difference| of sdpa (and flash) against eager on the same weights, in bf16."""
    cfg = ModelConfig(arch=arch, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=1000, max_seq_len=512)
    torch.manual_seed(0)
    ref = DecoderLM(ModelConfig(**{**cfg.__dict__, "attn_backend": "eager"})).to(DEVICE, DTYPE)
    tokens = torch.randint(0, 1000, (2, 512), device=DEVICE)
    out, want = {}, ref(tokens).float()
    for backend in ("sdpa", "flash"):
        if backend == "flash" and not flash_available():
            out[backend] = float("nan")
            continue
        m = DecoderLM(ModelConfig(**{**cfg.__dict__, "attn_backend": backend})).to(DEVICE, DTYPE)
        m.load_state_dict(ref.state_dict())
        out[backend] = (m(tokens).float() - want).abs().max().item()
    return out


def throughput(name: str, batch: int, seq_len: int, steps: int) -> tuple[float, float]:
    """Training fwd+bwd tokens/s (no optimizer step) and MFU against the device's dense bf16 peak."""
    cfg = preset(name, max_seq_len=seq_len) if not SMOKE else preset(name)
    torch.manual_seed(0)
    model = DecoderLM(cfg).to(DEVICE, DTYPE)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=DEVICE)

    def step() -> None:
        logits = model(tokens[:, :-1])  # noqa: F821 - the enclosing model
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()

    for _ in range(2):
        step()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    tps = steps * batch * seq_len / (time.perf_counter() - t0)
    name_ = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    peak = peak_tflops(name_)  # the trainer's table: dense bf16 TFLOP/s by device name
    mfu = tps * model_stats(cfg, seq_len).flops_per_token / (peak * 1e12) if peak else float("nan")
    del model
    return tps, mfu


def main() -> None:
    print(
        f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu (smoke)'}, torch {torch.__version__}, "
        f"flash-attn: {'yes' if flash_available() else 'no'}"
    )
    print(f"\n| arch | sdpa vs eager ({str(DTYPE)[6:]} max abs) | flash vs eager |\n|---|---|---|")
    archs = list(variants())  # every registered attention variant, the baseline (Transformer) first
    for name in archs:
        a = agreement(name)
        print(f"| {name} | {a['sdpa']:.3g} | {a['flash']:.3g} |")
    size, batch, seq, steps = ("tiny", 2, 128, 2) if SMOKE else ("1.4b", 4, 2048, 10)
    print(f"\n| preset (seq {seq}, batch {batch}, sdpa) | fwd+bwd tokens/s | MFU |\n|---|---|---|")
    rates = {}
    for name in archs:
        tps, mfu = throughput(f"{name}-{size}", batch, seq, steps)
        rates[name] = tps
        print(f"| {name}-{size} | {tps:,.0f} | {mfu:.1%} |")
    print()
    for name in archs[1:]:
        print(
            f"{variants()[name].label} / {variants()[archs[0]].label} throughput: {rates[name] / rates[archs[0]]:.3f}"
        )
    print("(paper Table 7, Diff / Transformer at 3B and 2K with its custom kernel: 0.916)")


if __name__ == "__main__":
    main()
