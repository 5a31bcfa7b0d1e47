"""Causal attention kernels: eager (materialised maps), sdpa, flash, flex attention for document masks on GPUs, and
the planner's "meta" stand-in; every variant's forward calls them (diffllm/model/variant.py), masks from documents.py.

Two forms of the same attention, chosen by the device (`flash_form`):

- the GPU form (every device but the CPU; meta included, where the planner and tests/model/test_kernel_calls.py stand
  in for a GPU): every call has one head dim for q, k and v, `is_causal=True` and no `attn_mask`, so SDPA runs its
  flash kernel (`one_head_dim`: Diff V1's 2d-wide values split into d-wide halves and its two key components called
  apart, as the official `multihead_flashdiff_2`; MLA's narrower values zero-padded to the query width, as
  DeepSeek's flash path). Document masks go to flex attention with the documents' BlockMask: no T x T tensor.
- the CPU form: one SDPA call with the values as wide as they are and, with documents, the dense mask: op for op what
  this file always ran on CPU (the golden losses hold bit for bit), and flex attention has no backward on CPU.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from ..errors import UserError
from .documents import Documents, causal_mask

try:  # flash-attn is an optional GPU extra; it cannot be built on CPU machines.
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

_FLASH_FORM_ON_CPU = False  # `flash_form_on_cpu()`: tests run the GPU form's numerics on the CPU


def flash_available() -> bool:
    return flash_attn_func is not None and torch.cuda.is_available()


def flash_form(t: torch.Tensor) -> bool:
    """Whether attention on t's device takes the GPU form (one head dim, flex for documents): on every device but
    the CPU, and on the CPU inside `flash_form_on_cpu()`."""
    return t.device.type != "cpu" or _FLASH_FORM_ON_CPU


@contextmanager
def flash_form_on_cpu() -> Iterator[None]:
    """Run the GPU form on the CPU (its numerics against float64 references; flex attention forward only there)."""
    global _FLASH_FORM_ON_CPU
    before, _FLASH_FORM_ON_CPU = _FLASH_FORM_ON_CPU, True
    try:
        yield
    finally:
        _FLASH_FORM_ON_CPU = before


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


def tiled(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The values tiled to the keys' head count: key head i reads value head i % Hv (layers.kernel_values's rule)."""
    return v if v.shape[1] == k.shape[1] else v.repeat(1, k.shape[1] // v.shape[1], 1, 1)


class _MetaFlash(torch.autograd.Function):
    """The planner's "meta" kernel, one call of the GPU form: outputs of the right shape, and it saves what
    FlashAttention-2 keeps for backward (q, k, v, out and the fp32 log-sum-exp), so activations can be counted on the
    meta device, where SDPA would trace its math path with T x T maps. Forward only: its backward is never run."""

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


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def one_head_dim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: Callable) -> torch.Tensor:
    """The GPU form: attention as calls `call(q, k, v)` whose q, k and v share q's head dim d (a flash kernel's
    condition), exactly equal to one call with v as it is. q (B, Hq, T, d), k (B, Hk, T, d), v (B, Hv, T, dv), key
    head i reading value head i % Hv -> (B, Hq, T, dv).
    The Hk/Hv key groups (Diff: its two components) call apart, each over its own query and key heads and the Hv
    value heads untiled; values wider than d are split into d-wide slices (Diff's 2d: two), narrower ones
    zero-padded to d and the output sliced back (MLA). Diff: 2 x 2 calls of h query heads, the official
    `multihead_flashdiff_2`; Transformer, Diff V2: one call; MLA: one call, v padded from d_v to d_n + d_r."""
    d, dv = q.shape[-1], v.shape[-1]
    width = -(-dv // d) * d  # dv rounded up to a multiple of d
    if width != dv:
        v = F.pad(v, (0, width - dv))  # (B, Hv, T, width): zero columns give zero outputs
    groups = k.shape[1] // v.shape[1]
    outs = [
        _cat([call(qg, kg, vs) for vs in v.split(d, dim=-1)], dim=-1)  # (B, Hq/groups, T, width)
        for qg, kg in zip(q.chunk(groups, dim=1), k.chunk(groups, dim=1))
    ]
    out = _cat(outs, dim=1)  # (B, Hq, T, width)
    return out if width == dv else out[..., :dv]


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """flash-attn on (B, H*, T, d) views: it wants (B, T, H*, d)."""
    return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)


@functools.cache
def _compiled_flex() -> Callable:
    return torch.compile(flex_attention)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents) -> torch.Tensor:
    """flex attention within the documents (docs.block_mask), GQA as the other kernels. Outside a compiled model a
    CUDA call runs flex compiled on its own (eager flex would materialise the scores)."""
    run = flex_attention
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        run = _compiled_flex()
    return run(q, k, v, block_mask=docs.block_mask, enable_gqa=q.shape[1] != k.shape[1])


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, docs: Optional[Documents] = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal) v with GQA.
    q: (B, Hq, Tq, d), k: (B, Hk, Tk, d), v: (B, Hv, Tk, dv) -> (B, Hq, Tq, dv): query head j reads key head
    j // (Hq/Hk), key head i reads value head i % Hv (Hv divides Hk; Diff's two key components share one value head),
    dv free to differ from d. Tq < Tk after a KV cache (the queries are the last Tq positions). With `docs` (packed
    rows) a query attends only within its own document. The form is the device's (module docstring); "triton" runs
    sdpa here (only Diff has a fused kernel, every other call is one standard attention already)."""
    if backend == "eager":
        return weigh(causal_probs(q, k, docs), tiled(k, v))
    if backend == "meta":  # the planner: the GPU form's calls, documents or not
        return one_head_dim(q, k, v, _MetaFlash.apply)
    if backend not in ("sdpa", "triton", "flash"):
        raise UserError(f"unknown attention backend {backend!r}")
    n_rep = q.shape[1] // k.shape[1]
    if q.shape[2] != k.shape[2]:  # queries after a KV cache (decoding): sdpa, bottom-right causal, any backend
        mask = (
            docs.mask
            if docs is not None
            else None
            if q.shape[2] == 1
            else causal_mask(q.shape[2], k.shape[2], q.device)
        )
        return F.scaled_dot_product_attention(q, k, tiled(k, v), attn_mask=mask, enable_gqa=n_rep > 1)
    if backend == "flash" and not flash_available():
        raise RuntimeError("attn_backend=flash needs flash-attn and a CUDA device; use attn_backend=sdpa here")
    if not flash_form(q):  # the CPU form: one call, the values as wide as they are; documents: the dense mask
        mask = docs.mask if docs is not None else None  # (B, 1, T, T)
        return F.scaled_dot_product_attention(
            q, k, tiled(k, v), attn_mask=mask, is_causal=mask is None, enable_gqa=n_rep > 1
        )
    if docs is not None:
        return one_head_dim(q, k, v, functools.partial(flex, docs=docs))
    return one_head_dim(q, k, v, _flash_attn if backend == "flash" else _sdpa_causal)
