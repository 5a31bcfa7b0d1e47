"""Fault injection (`trainer.faults`), a hook: the failures that the watchdog, non-finite, spike and signal tests need,
made at chosen steps (on rank 0, or on every rank for a spike), outside the step body."""

from __future__ import annotations

import threading
import time

import torch

from .config import FaultsConfig
from .hooks import Hook, View


class FaultInjection(Hook):
    """stall_at_steps: a data read that never returns; step_delay_s: a slow node (the other ranks wait); nan_at_steps:
    a real NaN loss; loss_scale_at_steps: every rank's loss, and so its gradients, times loss_scale (a spike). Steps
    count from 1 (the step being made)."""

    def __init__(self, cfg: FaultsConfig):
        self.stall, self.delay_s, self.nan = set(cfg.stall_at_steps), cfg.step_delay_s, set(cfg.nan_at_steps)
        self.scale_at, self.scale = set(cfg.loss_scale_at_steps), cfg.loss_scale

    def on_step_start(self, view: View) -> None:
        if view.rank != 0:
            return
        if view.state.step + 1 in self.stall:
            threading.Event().wait()  # the watchdog (phase "data") ends the process
        if self.delay_s:
            time.sleep(self.delay_s)

    def on_loss(self, view: View, loss: torch.Tensor) -> torch.Tensor:
        if view.rank == 0 and view.state.step + 1 in self.nan:
            return loss * float("nan")
        if view.state.step + 1 in self.scale_at:
            return loss * self.scale
        return loss


def fault_hooks(cfg: FaultsConfig) -> list[Hook]:
    """[FaultInjection] when trainer.faults names a step or a delay, else []."""
    return [FaultInjection(cfg)] if cfg.on else []
