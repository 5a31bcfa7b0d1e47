"""What the parts of one launch share once its processes are up (`LaunchContext`): this rank and the world size, the
device, the token budget and its WSD branching, the run directory, `say` and the step watchdog's `beat`. The Trainer
makes it once in `setup`; the resume plan, the step, the resumable state and the hooks' View read it instead of long
argument lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from ..budget import Branching, Budget
    from ..runs import Run


@dataclass(frozen=True)
class LaunchContext:
    rank: int
    world_size: int
    device: torch.device
    budget: Budget  # the token budget in steps (plan_budget)
    branching: Branching  # its branch points and, for a cooldown, the step it starts from (plan_branching)
    run: Run  # run_dir
    say: Callable[..., None]  # say(msg, error=False): rank 0 prints
    beat: Callable[[str], None] = lambda phase: None  # the step watchdog hears that `phase` is busy
