"""The language-model loss of a batch: the one loss of training (step.py) and validation (validation.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..data import Batch


def lm_loss(model, batch: Batch, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of `model` on a Batch of windows (B, T+1), in fp32 (float64 stays float64): the one
    loss of training and validation (the model's loss head, diffllm/model/loss.py). With document ids the model
    attends within documents. With a loss mask (data.loss_on=marked) only the marked targets count: their sum, or for
    "mean" their sum / their count (0 for none; a mask that marks every target gives today's loss bit for bit)."""
    return model(
        batch.inputs, **batch.model_kwargs(), targets=batch.targets, target_mask=batch.target_mask, reduction=reduction
    )
