"""Fused differential attention in Triton (attn_backend=triton): the launch of the kernels of
diffllm/model/triton_diff_kernels.py (whose docstring gives the equations, layouts and tiling) and their autograd op.

    out = (softmax(Q1 K1^T / sqrt d + causal) - lam softmax(Q2 K2^T / sqrt d + causal)) V     (B, h, T, 2d)

`fused_diff_attention(q, k, v, lam, docs=None)` is the interface DiffAttention calls; without CUDA the kernels run in
Triton's CPU interpreter (slow; for tests).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import UserError
from . import triton_diff_kernels as K
from .documents import Documents
from .triton_diff_kernels import INTERPRET, INTERPRET_BLOCKS, LOG2E, triton


def triton_available() -> bool:
    return triton is not None


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor, docs: Optional[Documents]
) -> tuple[int, int, int, int, int]:
    """One-line errors for bad inputs; returns (B, h, g, T, d)."""
    if triton is None:
        raise RuntimeError("attn_backend=triton needs the triton package (pip install triton); use sdpa here")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"fused_diff_attention: q, k, v must be 4-D, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, h2, T, d = q.shape
    g2 = k.shape[1]
    if h2 % 2 or g2 % 2 or h2 % g2 or k.shape != (B, g2, T, d) or v.shape != (B, g2 // 2, T, 2 * d):
        raise ValueError(
            f"fused_diff_attention: want q (B, 2h, T, d), k (B, 2g, T, d), v (B, g, T, 2d) with g | h; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if lam.numel() != 1:
        raise ValueError(f"fused_diff_attention: lam must be a scalar, got shape {tuple(lam.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"fused_diff_attention: q, k, v need one dtype of fp32/bf16/fp16, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if docs is not None and (docs.ids.shape != (B, T) or docs.n_queries != T):
        raise ValueError(
            f"fused_diff_attention: docs must describe the (B, T) = {(B, T)} positions, all of them "
            f"queries; got ids {tuple(docs.ids.shape)} with {docs.n_queries} queries"
        )
    if q.device.type != "cuda" and not INTERPRET:
        raise UserError(
            f"fused_diff_attention: tensors on {q.device}; the Triton kernels run on CUDA "
            "(or on CPU with TRITON_INTERPRET=1 set before triton is imported)"
        )
    return B, h2 // 2, g2 // 2, T, d


def _common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: int, g: int, T: int, d: int) -> dict:
    """Strides and the scalars/constexprs every kernel takes."""
    return dict(
        sqb=q.stride(0),
        sqh=q.stride(1),
        sqt=q.stride(2),
        skb=k.stride(0),
        skh=k.stride(1),
        skt=k.stride(2),
        svb=v.stride(0),
        svh=v.stride(1),
        svt=v.stride(2),
        H=h,
        G=g,
        T=T,
        D=d,
        DV=2 * d,
        REP=h // g,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(2 * d)),
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        **(INTERPRET_BLOCKS if INTERPRET else {}),
    )


def _grid(n_rows: int, n_programs: int, block: str):
    return lambda meta: (triton.cdiv(n_rows, meta[block]), n_programs)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _bounds(docs: Optional[Documents], like: torch.Tensor) -> dict:
    """The kernels' document arguments: docs.starts and docs.ends ((B, T) int32), or placeholders the DOCS=False
    kernels never read."""
    if docs is None:
        return dict(START=like, END=like, DOCS=False)
    return dict(START=docs.starts.contiguous(), END=docs.ends.contiguous(), DOCS=True)


def _forward(q, k, v, lam, save: bool, docs: Optional[Documents] = None) -> tuple:
    """Launch the forward: (out, O1, O2, LSE, contiguous q, k, v, fp32 lam); O1, O2, LSE only when `save`."""
    B, h, g, T, d = _check(q, k, v, lam, docs)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    lam32 = lam.detach().reshape(()).to(torch.float32)
    o = torch.empty(B, h, T, 2 * d, device=q.device, dtype=q.dtype)  # (B, h, T, 2d)
    o1, o2 = (torch.empty_like(o), torch.empty_like(o)) if save else (o, o)  # unused pointers when not saving
    lse = torch.empty(B, h, 2, T, device=q.device, dtype=torch.float32) if save else o
    bounds = _bounds(docs, q)
    K._fwd_kernel[_grid(T, B * h, "BLOCK_M")](
        q,
        k,
        v,
        lam32,
        o,
        o1,
        o2,
        lse,
        bounds["START"],
        DOCS=bounds["DOCS"],
        scale_log2=d**-0.5 * LOG2E,
        SAVE=save,
        **_common(q, k, v, h, g, T, d),
    )
    return o, o1, o2, lse, q, k, v, lam32


class _FusedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, docs):  # q (B, 2h, T, d), k (B, 2g, T, d), v (B, g, T, 2d), lam 0-dim
        o, o1, o2, lse, q, k, v, lam32 = _forward(q, k, v, lam, save=True, docs=docs)
        ctx.save_for_backward(q, k, v, lam32, o1, o2, lse)
        ctx.lam_dtype, ctx.docs = lam.dtype, docs
        return o

    @staticmethod
    def backward(ctx, do):  # do (B, h, T, 2d)
        q, k, v, lam32, o1, o2, lse = ctx.saved_tensors
        B, h2, T, d = q.shape
        h, g = h2 // 2, k.shape[1] // 2
        do = do.contiguous()
        delta = torch.empty_like(lse)  # Dc = rowsum(dO * Oc): (B, h, 2, T) fp32; dlam = -sum(D2) as d out/d lam = -O2
        K._bwd_delta_kernel[(triton.cdiv(T, 16), B * h)](
            do, o1, o2, delta, T, 2 * d, BLOCK_DV=max(16, triton.next_power_of_2(2 * d)), BLOCK_M=16
        )
        dq, dk, dv = (
            torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
        )
        args = _common(q, k, v, h, g, T, d)
        scales = dict(scale_log2=d**-0.5 * LOG2E, sm_scale=d**-0.5)
        bounds = _bounds(ctx.docs, q)
        K._bwd_dkdv_kernel[_grid(T, B * g, "BLOCK_N")](
            q, k, v, lam32, do, lse, delta, dk, dv, **bounds, **scales, **args
        )
        K._bwd_dq_kernel[_grid(T, B * h, "BLOCK_M")](
            q, k, v, lam32, do, lse, delta, dq, bounds["START"], DOCS=bounds["DOCS"], **scales, **args
        )
        dlam = -delta[:, :, 1].sum()
        return dq, dk, dv, dlam.to(ctx.lam_dtype), None


def fused_diff_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor, docs: Optional[Documents] = None
) -> torch.Tensor:
    """(softmax(Q1 K1^T/sqrt d + causal) - lam softmax(Q2 K2^T/sqrt d + causal)) V, differentiable in q, k, v, lam.
    q: (B, 2h, T, d) [Q1 heads, Q2 heads], k: (B, 2g, T, d) [K1, K2], v: (B, g, T, 2d), lam: 0-dim -> (B, h, T, 2d);
    diff head i reads kv group i // (h/g). docs (Documents of the T positions): both maps within each document."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, lam)):
        return _FusedDiffAttention.apply(q, k, v, lam, docs)
    return _forward(q, k, v, lam, save=False, docs=docs)[0]  # inference: nothing kept for a backward
