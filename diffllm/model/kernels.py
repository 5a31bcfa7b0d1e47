"""Causal attention kernels: eager (materialised maps), sdpa, flash, and the planner's "meta" stand-in; every variant's
forward calls them (diffllm/model/variant.py), masks from documents.py."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import UserError
from .documents import Documents, causal_mask

try:  # flash-attn is an optional GPU extra; it cannot be built on CPU machines.
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = flash_attn_varlen_func = None


def flash_available() -> bool:
    return flash_attn_func is not None and torch.cuda.is_available()


def causal_probs(q: torch.Tensor, k: torch.Tensor, docs: Optional[Documents] = None) -> torch.Tensor:
    """Materialised causal attention maps, softmax in fp32.
    q: (B, Hq, Tq, d), k: (B, Hkv, Tk, d) -> (B, Hq, Tq, Tk); query head h reads kv head h // (Hq/Hkv); the queries
    are the last Tq of the Tk positions (Tq = Tk without a KV cache). With `docs`, a query sees only the keys of its
    own document (docs.mask)."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)  # (B, Hq, Tk, d)
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for float64 references
    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, Hq, Tq, Tk)
    seen = causal_mask(q.shape[2], k.shape[2], q.device) if docs is None else docs.mask  # (Tq, Tk) | (B, 1, Tq, Tk)
    return scores.masked_fill(~seen, float("-inf")).softmax(dim=-1).type_as(q)


def weigh(maps: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """maps (B, H, Tq, Tk) @ v (B, Hv, Tk, dv) -> (B, H, Tq, dv); map head i reads value head i // (H/Hv)."""
    return maps @ v.repeat_interleave(maps.shape[1] // v.shape[1], dim=1)


class _MetaFlash(torch.autograd.Function):
    """The planner's "meta" kernel: outputs of the right shape and saves what FlashAttention-2 keeps for backward
    (q, k, v, out and the fp32 log-sum-exp), so activations can be counted on the meta device, where SDPA would
    trace its math path with T x T maps. Forward only: its backward is never run."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        B, H, T, _ = q.shape
        out = q.new_empty(B, T, H, v.shape[-1]).transpose(1, 2)  # flash kernels write (B, T, H, d): views follow
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        raise NotImplementedError("the meta attention kernel only measures saved tensors")


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, docs: Optional[Documents] = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal) v with GQA (query head h reads kv head h // (Hq/Hkv)).
    q: (B, Hq, Tq, d), k: (B, Hkv, Tk, d); v: (B, Hkv, Tk, dv) with dv free to differ from d -> (B, Hq, Tq, dv);
    Tq < Tk after a KV cache (the queries are the last Tq positions). With `docs` (packed rows), a query attends
    only within its own document: the dense docs.mask for eager/sdpa, docs.varlen() segments for flash.
    "triton" runs sdpa here: only Diff has a fused kernel, every other call is one standard attention already."""
    n_rep = q.shape[1] // k.shape[1]
    if backend == "eager":
        return weigh(causal_probs(q, k, docs), v)
    if backend == "meta":
        return _MetaFlash.apply(q, k, v)
    if docs is not None and (q.shape[2] != k.shape[2] or backend in ("sdpa", "triton")):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.mask, enable_gqa=n_rep > 1)  # (B, 1, Tq, Tk)
    if q.shape[2] != k.shape[2]:  # queries after a KV cache: sdpa with the bottom-right causal mask, any backend
        mask = None if q.shape[2] == 1 else causal_mask(q.shape[2], k.shape[2], q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
    if backend in ("sdpa", "triton"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
    if backend == "flash":
        if not flash_available():
            raise RuntimeError("attn_backend=flash needs flash-attn and a CUDA device; use attn_backend=sdpa here")
        # flash-attn wants (B, T, H, d) and one head dim for q, k and v: split a wider v into d-sized slices.
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        outs = [_flash(qt, kt, vs.transpose(1, 2), docs) for vs in v.split(q.shape[-1], dim=-1)]
        return torch.cat(outs, dim=-1).transpose(1, 2)
    raise UserError(f"unknown attention backend {backend!r}")


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Optional[Documents]) -> torch.Tensor:
    """One flash-attn call on (B, T, H*, d) tensors -> (B, T, Hq, d): flash_attn_func, or with `docs` the varlen
    kernel over the flattened (B * T) tokens, one causal segment per document."""
    if docs is None:
        return flash_attn_func(q, k, v, causal=True)
    B, T = q.shape[:2]
    cu_seqlens, max_len = docs.varlen()  # (n_docs + 1,) int32
    out = flash_attn_varlen_func(
        q.reshape(B * T, *q.shape[2:]),
        k.reshape(B * T, *k.shape[2:]),
        v.reshape(B * T, *v.shape[2:]),
        cu_seqlens,
        cu_seqlens,
        max_len,
        max_len,
        causal=True,
    )  # (B * T, Hq, d)
    return out.view(B, T, *out.shape[1:])
