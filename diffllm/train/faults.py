"""Fault injection (trainer.inject_*), a hook: the failures that the watchdog, non-finite and signal tests need,
made on rank 0 at chosen steps, outside the step body."""
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
    inject_nan_at_steps: a real NaN loss. Steps count from 1 (the step being made)."""

    def __init__(self, cfg: TrainerConfig):
        self.stall, self.delay_s, self.nan = set(cfg.inject_stall_at_steps), cfg.inject_step_delay_s, set(cfg.inject_nan_at_steps)

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
        return loss


def fault_hooks(cfg: TrainerConfig) -> list[Hook]:
    """[FaultInjection] when any trainer.inject_* is set, else []."""
    on = cfg.inject_stall_at_steps or cfg.inject_step_delay_s or cfg.inject_nan_at_steps
    return [FaultInjection(cfg)] if on else []
