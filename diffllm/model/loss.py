"""The loss head: next-token cross-entropy from the final hidden states, computed in fp32 (float64 stays float64).

    logits = (h W_head^T) * readout_scale          (B, T, V); readout_scale is 1 but under mup
    loss   = CE(logits, targets) over the targets the mask keeps: their sum, or their mean ("mean")

`DecoderLM.forward(..., targets=...)` calls it, so the head, the loss and the model run as one forward (one compiled
graph, one ZeRO-3 trace)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # F.cross_entropy's ignore_index: targets outside the loss mask


def head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    readout_scale: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """hidden (B, T, E) after the final norm, targets (B, T) long, mask (B, T) bool or None (every target counts) ->
    the 0-dim loss. "mean": the sum over the counted targets / their count (0 for none); "sum": the sum."""
    logits = head(hidden)  # (B, T, V)
    logits = logits if readout_scale == 1.0 else logits * readout_scale
    logits = logits.flatten(0, 1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B*T, V)
    if mask is None:
        return F.cross_entropy(logits, targets.flatten(), reduction=reduction)
    total = F.cross_entropy(logits, targets.masked_fill(~mask, IGNORE).flatten(), reduction="sum", ignore_index=IGNORE)
    return total if reduction == "sum" else total / mask.sum().clamp(min=1)
