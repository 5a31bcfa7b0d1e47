"""GPU check of document masks (packed rows), installs nothing: for every registered arch, a packed window of three
documents per row through the sdpa backend (on a GPU: flex attention with the documents' block mask) and, for Diff,
the fused Triton kernel, against eager (the materialised maps with the dense document mask, fp32 softmax), in bf16:
max |logit difference| and the largest relative parameter-gradient difference. Prints 'skipped: ...' rows without
CUDA or triton. `GPU_CHECK_SMOKE=1` runs the same code on CPU (fp32, a short window: sdpa's CPU form, the dense mask;
Triton in its interpreter)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import interpreter_failure, record  # noqa: E402

from diffllm.model import DecoderLM, ModelConfig  # noqa: E402
from diffllm.model.registry import variants  # noqa: E402

SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "cuda"
DTYPE = torch.float32 if SMOKE else torch.bfloat16
SPLITS = [(9, 14, 9), (20, 4, 8)] if SMOKE else [(300, 500, 224), (1000, 16, 8)]  # 3 documents per row


def run(model: DecoderLM, tokens: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits (fp32) and the parameter gradients of their mean square."""
    model.zero_grad(set_to_none=True)
    logits = model(tokens, doc_ids=ids, restart_positions=True).float()
    logits.pow(2).mean().backward()
    return logits.detach(), [p.grad.float() for p in model.parameters()]


def backends(arch: str) -> dict[str, str]:
    """backend -> why it cannot run here ('' when it can)."""
    out = {"sdpa": ""}
    if arch == "diff":  # only Diff has a fused kernel; elsewhere 'triton' is sdpa
        out["triton"] = "" if importlib.util.find_spec("triton") else "skipped: no triton"  # CPU: its interpreter
    return out


def main() -> None:
    print(
        f"\n| doc masks ({str(DTYPE)[6:]}, rows of {[list(s) for s in SPLITS]}) | backend | max abs logit diff vs "
        f"eager | max rel grad diff |\n|---|---|---|---|"
    )
    if not SMOKE and not torch.cuda.is_available():
        print("| all | all | skipped: no CUDA | |")
        record(part="doc masks", model="all", result="skipped: no CUDA")
        return
    ids = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in SPLITS], device=DEVICE)
    T = ids.shape[1]
    shape = f"{T} x {len(SPLITS)} (3 docs a row)"
    for arch in variants():
        cfg = dict(arch=arch, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=1000, max_seq_len=T)
        torch.manual_seed(0)
        ref = DecoderLM(ModelConfig(**cfg, attn_backend="eager")).to(DEVICE, DTYPE)
        tokens = torch.randint(0, 1000, ids.shape, device=DEVICE)
        want, want_grads = run(ref, tokens, ids)
        for backend, why in backends(arch).items():
            if why:
                print(f"| {arch} | {backend} | {why} | |")
                record(part="doc masks", model=arch, setting=f"{backend} vs eager", shape=shape, result=why)
                continue
            model = DecoderLM(ModelConfig(**cfg, attn_backend=backend)).to(DEVICE, DTYPE)
            model.load_state_dict(ref.state_dict())
            try:
                got, grads = run(model, tokens, ids)
            except Exception as err:  # noqa: BLE001 - only Triton's CPU interpreter in smoke mode is let through
                if (why := interpreter_failure(err)) is None:
                    raise
                print(f"| {arch} | {backend} | {why} | |")
                record(part="doc masks", model=arch, setting=f"{backend} vs eager", shape=shape, result=why)
                continue
            rel = max(((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item() for g, w in zip(grads, want_grads))
            logit = (got - want).abs().max().item()
            print(f"| {arch} | {backend} | {logit:.3g} | {rel:.3g} |")
            record(
                part="doc masks",
                model=arch,
                setting=f"{backend} vs eager",
                shape=shape,
                result=f"max abs logit diff {logit:.3g}, max rel grad diff {rel:.3g}",
            )
            del model


if __name__ == "__main__":
    main()
