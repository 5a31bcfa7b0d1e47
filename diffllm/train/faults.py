"""Fault injection (trainer.inject_*), a hook: the failures that the watchdog, non-finite, spike and signal tests
need, made at chosen steps (on rank 0, or on every rank for a spike), outside the step body."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch

from .config import TrainerConfig
from .hooks import Hook

if TYPE_CHECKING:
    from .loop import Trainer


class FaultInjection(Hook):
    """inject_stall_at_steps: a data read that never returns; inject_step_delay_s: a slow node (the other ranks wait);
    inject_nan_at_steps: a real NaN loss; inject_loss_scale_at_steps: every rank's loss, and so its gradients, times
    inject_loss_scale (a spike). Steps count from 1 (the step being made)."""

    def __init__(self, cfg: TrainerConfig):
        self.stall, self.delay_s, self.nan = set(cfg.inject_stall_at_steps), cfg.inject_step_delay_s, set(cfg.inject_nan_at_steps)
        self.scale_at, self.scale = set(cfg.inject_loss_scale_at_steps), cfg.inject_loss_scale

    def on_step_start(self, trainer: "Trainer") -> None:
        if trainer.rank != 0:
            return
        if trainer.state.step + 1 in self.stall:
            threading.Event().wait()  # the watchdog (phase "data") ends the process
        if self.delay_s:
            time.sleep(self.delay_s)

    def on_loss(self, trainer: "Trainer", loss: torch.Tensor) -> torch.Tensor:
        if trainer.rank == 0 and trainer.state.step + 1 in self.nan:
            return loss * float("nan")
        if trainer.state.step + 1 in self.scale_at:
            return loss * self.scale
        return loss


def fault_hooks(cfg: TrainerConfig) -> list[Hook]:
    """[FaultInjection] when any trainer.inject_* is set, else []."""
    on = cfg.inject_stall_at_steps or cfg.inject_step_delay_s or cfg.inject_nan_at_steps or cfg.inject_loss_scale_at_steps
    return [FaultInjection(cfg)] if on else []
