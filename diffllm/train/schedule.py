"""Learning-rate schedules as pure functions of the step: warmup, then linear (the paper's), cosine, WSD or constant.

A pure function needs no state of its own: the step counter in the checkpoint is the whole schedule state.
"""

from __future__ import annotations

import math

from ..budget import decay_start
from .config import OptimConfig


def lr_at(step: int, total_steps: int, opt: OptimConfig) -> float:
    """The learning rate of update number `step` (0-based) out of `total_steps`.

    warmup: lr * (step + 1) / warmup_steps for the first warmup_steps updates (never 0), then, over the remaining
    updates with progress p from 0 (first) to 1 (last):
      linear    lr -> min_lr linearly                         (Diff Transformer: 3.2e-4 -> 1.28e-5)
      cosine    min_lr + (lr - min_lr) (1 + cos(pi p)) / 2
      wsd       lr until the last decay_fraction of all steps, then linearly down to min_lr
      constant  lr
    """
    warmup = min(opt.warmup_steps, total_steps)
    if step < warmup:
        return opt.lr * (step + 1) / warmup
    if opt.schedule == "constant":
        return opt.lr
    if opt.schedule == "wsd":
        start = decay_start(total_steps, opt)
        if step < start:
            return opt.lr
        return _linear(opt.lr, opt.min_lr, step - start, total_steps - start)
    if opt.schedule == "cosine":
        p = _progress(step - warmup, total_steps - warmup)
        return opt.min_lr + (opt.lr - opt.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    return _linear(opt.lr, opt.min_lr, step - warmup, total_steps - warmup)


def _progress(i: int, n: int) -> float:
    """i-th of n updates -> 0..1 (the last update is 1)."""
    return 1.0 if n <= 1 else min(1.0, i / (n - 1))


def _linear(start: float, end: float, i: int, n: int) -> float:
    return start + (end - start) * _progress(i, n)
