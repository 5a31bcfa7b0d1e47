"""Diff attention backends on one GPU, printed as one markdown table (installs nothing; torch, PyYAML, triton):
bf16 agreement of eager | sdpa | flash | triton (forward and dq, dk, dv, dlam) against float64, then training fwd+bwd
tokens/s and MFU of transformer-1.4b vs diff-1.4b (each backend) vs diff2-1.4b (when that preset exists) at seq 2048
and 4096 with the micro-batch that fills memory, then the block sizes Triton's autotuner picked.
`GPU_CHECK_SMOKE=1` runs the same code on CPU (fp32, tiny presets, Triton interpreter) to prove that it runs.
`GPU_BENCH_BUDGET_S` (default 280) bounds the throughput rows: those left when it is spent print as skipped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import DEVICE, DTYPE, SMOKE, interpreter_failure, preset, record  # noqa: E402  (one preset loader, one smoke switch)

from diffllm.hardware import peak_tflops  # noqa: E402
from diffllm.model import DecoderLM  # noqa: E402
from diffllm.model.accounting import model_stats  # noqa: E402
from diffllm.model.kernels import causal_attention, flash_available  # noqa: E402
from diffllm.model.triton_diff import fused_diff_attention, triton_available  # noqa: E402

DEADLINE = time.monotonic() + float(os.environ.get("GPU_BENCH_BUDGET_S", "280"))
ROWS: list[str] = []


def row(check, shape, backend, seq, batch, tps, mfu, ratio, note) -> None:
    cells = (check, shape, backend, seq, batch, tps, mfu, ratio, note)
    ROWS.append("| " + " | ".join(str(c) for c in cells) + " |")
    print(ROWS[-1], flush=True)
    result = "; ".join(filter(None, (f"vs transformer {ratio}" if ratio else "", note)))
    shape_ = f"{seq} x {batch}" if seq != "" and batch != "" else ""
    record(
        part=f"diff attention {check}", model=shape, setting=backend, shape=shape_, tokens_s=tps, mfu=mfu, result=result
    )


def diff_core(q, k, v, lam, backend: str) -> torch.Tensor:
    """(P1 - lam P2) V for q (B, 2h, T, d), k (B, 2g, T, d), v (B, g, T, 2d) -> (B, h, T, 2d), by backend: the
    fused kernel, or the model's own kernel calls (diffllm/model/kernels.py causal_attention: on a GPU four calls of
    head dim d, each component against each d-wide half of V; on the CPU one call with V 2d wide)."""
    if backend == "triton":
        return fused_diff_attention(q, k, v, lam)
    B, h2, T, d = q.shape
    out = causal_attention(q, k, v, backend).view(B, 2, h2 // 2, T, 2 * d)
    return out[:, 0] - lam.to(out.dtype) * out[:, 1]


def agreement(B: int, h: int, g: int, T: int, d: int, lam: float) -> None:
    """Max relative error of each backend against the float64 eager path on the same low-precision inputs."""
    torch.manual_seed(0)
    x = [torch.randn(B, 2 * h, T, d), torch.randn(B, 2 * g, T, d), torch.randn(B, g, T, 2 * d)]
    leaves = [t.to(DEVICE, DTYPE).requires_grad_() for t in x] + [torch.tensor(lam, device=DEVICE).requires_grad_()]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    want = diff_core(*ref_leaves, "eager")
    grad_out = torch.randn_like(want)
    wants = [want, *torch.autograd.grad(want, ref_leaves, grad_out)]
    shape = f"B{B} h{h} g{g} T{T} d{d} lam{lam:+g}"
    for backend in ("eager", "sdpa", "flash", "triton"):
        if (backend == "flash" and not flash_available()) or (backend == "triton" and not triton_available()):
            row("agreement", shape, backend, T, B, "", "", "", "not available")
            continue
        try:
            out = diff_core(*leaves, backend)
            got = [out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]
        except Exception as err:  # noqa: BLE001 - only Triton's CPU interpreter in smoke mode is let through
            if (why := interpreter_failure(err)) is None:
                raise
            row("agreement", shape, backend, T, B, "", "", "", why)
            continue
        errs = [((a.double() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, wants)]
        row(
            "agreement",
            shape,
            backend,
            T,
            B,
            "",
            "",
            "",
            "max rel err " + ", ".join(f"{n} {e:.1e}" for n, e in zip(("out", "dq", "dk", "dv", "dlam"), errs)),
        )


def train_step(model, tokens) -> None:
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=False)


def peak_bytes(model, batch: int, seq: int, vocab: int) -> int | None:
    """Peak memory of one fwd+bwd step at `batch`, or None when it does not fit."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        train_step(model, torch.randint(0, vocab, (batch, seq + 1), device=DEVICE))
    except torch.cuda.OutOfMemoryError:
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def fill_batch(model, seq: int, vocab: int) -> int:
    """The largest micro-batch that fits: a linear fit of peak memory over batches 1 and 2, then backing off."""
    if SMOKE:
        return 2
    p1, p2 = peak_bytes(model, 1, seq, vocab), peak_bytes(model, 2, seq, vocab)
    if p1 is None or p2 is None:
        return 1
    free = torch.cuda.get_device_properties(0).total_memory * 0.92
    batch = max(2, int((free - (p1 - (p2 - p1))) // max(p2 - p1, 1)))
    while batch > 2 and peak_bytes(model, batch, seq, vocab) is None:
        batch = int(batch * 0.85)
    return batch


def throughput(name: str, backend: str, seq: int, base_tps: float | None) -> float | None:
    """One row: fwd+bwd tokens/s (no optimizer step) and MFU against the device's dense bf16 peak."""
    if time.monotonic() > DEADLINE:
        row("throughput", name, backend, seq, "", "", "", "", "skipped (time budget)")
        return None
    try:
        cfg = preset(name, attn_backend=backend, max_seq_len=seq)
    except ValueError as err:
        row("throughput", name, backend, seq, "", "", "", "", f"not run: {err}")
        return None
    torch.manual_seed(0)
    with torch.device(DEVICE):  # initialise on the device: a 1.4B init on the host takes tens of seconds
        model = DecoderLM(cfg).to(DTYPE)
    batch = fill_batch(model, seq, cfg.vocab_size)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=DEVICE)
    steps = 1 if SMOKE else 5
    try:
        train_step(model, tokens)  # warm-up (and Triton autotuning at a new shape)
    except Exception as err:  # noqa: BLE001 - only Triton's CPU interpreter in smoke mode is let through
        if (why := interpreter_failure(err)) is None:
            raise
        row("throughput", name, backend, seq, batch, "", "", "", why)
        return None
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(model, tokens)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    tps = steps * batch * seq / (time.perf_counter() - t0)
    peak = peak_tflops(torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu")
    mfu = f"{tps * model_stats(cfg, seq).flops_per_token / (peak * 1e12):.1%}" if peak else "n/a"
    ratio = f"{tps / base_tps:.3f}" if base_tps else ""
    row("throughput", name, backend, seq, batch, f"{tps:,.0f}", mfu, ratio, "")
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return tps


def autotune_rows() -> None:
    """The block sizes the autotuner chose for each kernel (the last shape it tuned)."""
    from diffllm.model import triton_diff_kernels as td

    for kernel in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        best = getattr(getattr(td, kernel, None), "best_config", None)
        row(
            "autotune",
            kernel,
            "triton",
            "",
            "",
            "",
            "",
            "",
            str(best) if best else f"interpreter: fixed blocks {td.INTERPRET_BLOCKS}" if td.INTERPRET else "not tuned",
        )


def main() -> None:
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)"
    print(
        f"device: {device}, torch {torch.__version__}, flash-attn: {'yes' if flash_available() else 'no'}, "
        f"triton: {__import__('triton').__version__ if triton_available() else 'no'}, dtype {str(DTYPE)[6:]}\n"
    )
    print("| check | model / shape | backend | seq | micro-batch | fwd+bwd tokens/s | MFU | vs transformer | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in (
        [(1, 2, 2, 40, 16, 0.8), (1, 2, 1, 19, 80, -0.3)]
        if SMOKE
        else [(2, 8, 8, 1000, 128, 0.8), (2, 8, 2, 777, 80, -0.3)]
    ):
        agreement(*shape)
    size, seqs = ("tiny", (64, 128)) if SMOKE else ("1.4b", (2048, 4096))
    has_v2 = (Path(__file__).resolve().parents[1] / f"configs/model/diff2-{size}.yaml").exists()
    for seq in seqs:
        base = throughput(f"transformer-{size}", "flash" if flash_available() else "sdpa", seq, None)
        for backend in ("triton", "sdpa", "flash"):
            if backend == "flash" and not flash_available():
                continue
            throughput(f"diff-{size}", backend, seq, base)
        if has_v2:
            throughput(f"diff2-{size}", "flash" if flash_available() else "sdpa", seq, base)
    if triton_available():
        autotune_rows()


if __name__ == "__main__":
    main()
