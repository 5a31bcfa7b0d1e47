"""The loss head: next-token cross-entropy from the final hidden states, computed in fp32 (float64 stays float64),
over chunks of tokens so that the (tokens x vocab) fp32 logits are never held whole.

    logits = (h W_head^T) * readout_scale          (B, T, V); readout_scale is 1 but under mup
    loss   = CE(logits, targets) over the targets the mask keeps: their sum, or their mean ("mean")

Chunks (`chunk_tokens`): the B*T tokens are cut into the fewest equal chunks whose fp32 logits each fit in
CHUNK_BYTES (256 MiB; 8 x 2048 tokens: 13 chunks of 1,261 at vocab 50,304, 25 of 656 at 100,288; the tiny CPU
runs' micro-batches: one chunk). A micro-batch that fits in one chunk runs
exactly the unchunked ops (`full_loss`, bit for bit what the loss always was). Otherwise each chunk's head matmul,
fp32 cast and summed cross-entropy run under non-reentrant activation checkpointing: backward keeps only the hidden
states (B*T*E) and the targets, and recomputes one chunk's logits at a time (one extra head matmul per step).

On CUDA, where Liger-Kernel imports (`pip install liger-kernel`; never required), a multi-chunk loss with gradients
runs its fused linear + cross-entropy kernel instead (`_liger_loss`): gradients computed chunk by chunk in the forward,
no recompute. It reads the head's weight directly, so a ZeRO-3 partitioned head (gathered only by its module hooks),
float64, and a torch.compile trace keep the torch path. Liger reads the number of counted targets back to the host:
one sync per micro-batch that the torch path does not make.

`DecoderLM.forward(..., targets=...)` calls `head_loss`, so the head, the loss and the model run as one forward (one
compiled graph, one ZeRO-3 trace)."""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE = -100  # F.cross_entropy's ignore_index: targets outside the loss mask
CHUNK_BYTES = 256 * 2**20  # the fp32 logits one chunk may hold (tests shrink it to force chunks)


@functools.cache
def _liger_flce():
    """Liger-Kernel's fused linear + cross-entropy function, or None where it does not import (imported at the first
    CUDA loss that could use it, so CPU processes never import triton for it)."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception:  # noqa: BLE001 - absent, or present but unable to import (no triton, no CUDA build)
        return None
    return liger_fused_linear_cross_entropy


def chunk_tokens(n_tokens: int, vocab: int, itemsize: int = 4, limit: Optional[int] = None) -> int:
    """Tokens per chunk: all `n_tokens` when their logits (`itemsize` bytes each: 4 for fp32) fit in `limit` bytes
    (CHUNK_BYTES), else n_tokens split into the fewest equal chunks that fit (at least 1 token each)."""
    fit = max(1, (CHUNK_BYTES if limit is None else limit) // (vocab * itemsize))
    return n_tokens if n_tokens <= fit else math.ceil(n_tokens / math.ceil(n_tokens / fit))


def full_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    readout_scale: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """The unchunked loss: the whole (B*T, V) fp32 logits at once. `head_loss` runs exactly these ops for one chunk."""
    logits = head(hidden)  # (B, T, V)
    logits = logits if readout_scale == 1.0 else logits * readout_scale
    logits = logits.flatten(0, 1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B*T, V)
    if mask is None:
        return F.cross_entropy(logits, targets.flatten(), reduction=reduction)
    total = F.cross_entropy(logits, targets.masked_fill(~mask, IGNORE).flatten(), reduction="sum", ignore_index=IGNORE)
    return total if reduction == "sum" else total / mask.sum().clamp(min=1)


def head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    readout_scale: float = 1.0,
    reduction: str = "mean",
    chunk: Optional[int] = None,
) -> torch.Tensor:
    """hidden (B, T, E) after the final norm, targets (B, T) long, mask (B, T) bool or None (every target counts) ->
    the 0-dim loss. "mean": the sum over the counted targets / their count (0 for none); "sum": the sum.
    `chunk`: tokens per chunk (default `chunk_tokens`' rule)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: want 'mean' or 'sum', got {reduction!r}")
    B, T, E = hidden.shape
    width = torch.promote_types(hidden.dtype, torch.float32).itemsize
    size = chunk or chunk_tokens(B * T, head.out_features, width)
    if size >= B * T:
        return full_loss(head, hidden, targets, mask, readout_scale, reduction)
    h = hidden.flatten(0, 1)  # (B*T, E)
    t = (targets if mask is None else targets.masked_fill(~mask, IGNORE)).flatten()  # (B*T,)
    if _liger_applies(head, h):
        total = _liger_loss(head, h, t, readout_scale)
    else:
        total = _chunked_sum(head, h, t, readout_scale, size)
    if reduction == "sum":
        return total
    return total / (B * T if mask is None else mask.sum().clamp(min=1))


def _chunk_sum(head: nn.Module, h: torch.Tensor, t: torch.Tensor, readout_scale: float) -> torch.Tensor:
    """h (n, E), t (n,) -> the summed cross-entropy of the chunk's counted targets: full_loss's ops on n tokens."""
    logits = head(h)  # (n, V)
    logits = logits if readout_scale == 1.0 else logits * readout_scale
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, t, reduction="sum", ignore_index=IGNORE)


def _chunked_sum(head: nn.Module, h: torch.Tensor, t: torch.Tensor, readout_scale: float, size: int) -> torch.Tensor:
    """The summed loss chunk by chunk; with gradients, each chunk recomputed in backward (only h and t are kept)."""
    total = None
    for hc, tc in zip(h.split(size), t.split(size)):  # (n, E), (n,)
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_sum, head, hc, tc, readout_scale, use_reentrant=False, preserve_rng_state=False)
        else:
            part = _chunk_sum(head, hc, tc, readout_scale)
        total = part if total is None else total + part
    return total


def _liger_applies(head: nn.Module, h: torch.Tensor) -> bool:
    """Liger's fused kernel: on CUDA, with gradients, outside a torch.compile trace, for a head whose weight is whole
    (not ZeRO-3 partitioned: such a weight has a `ds_id` and is gathered only inside the module's call)."""
    return (
        h.is_cuda
        and h.dtype != torch.float64
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and isinstance(head, nn.Linear)
        and head.bias is None
        and not hasattr(head.weight, "ds_id")
        and _liger_flce() is not None
    )


def _liger_loss(head: nn.Linear, h: torch.Tensor, t: torch.Tensor, readout_scale: float) -> torch.Tensor:
    """Liger-Kernel's fused linear + cross-entropy: the summed loss of h (N, E) against t (N,). readout_scale scales
    the hidden states instead of the logits (the same product; it rounds once in a different place)."""
    h = h if readout_scale == 1.0 else h * readout_scale
    return _liger_flce()(h, head.weight, t, ignore_index=IGNORE, reduction="sum")
