"""Everything a resume needs besides DeepSpeed's own files, saved and loaded in one place (`Resumable`): the counters
(`TrainState`), every rank's data-loader and RNG states, the resolved config, and the checkpoint's meta.json."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Optional

from ..dist import all_gather_object
from ..spikes import SpikeHistory
from .save import rng_state, set_rng_state

if TYPE_CHECKING:
    from ..config import TrainConfig
    from ..context import LaunchContext


@dataclass
class TrainState:
    """Counters that move with every step."""

    step: int = 0  # optimizer steps done (skipped non-finite steps included: they consumed their data)
    tokens: int = 0  # training tokens seen = step x global_batch_tokens (what budgets, metrics and scaling count)
    loss_tokens: int = 0  # of their targets, those counted in the loss (all of them unless data.loss_on=marked)
    elapsed_s: float = 0.0  # wall time of all launches together, up to the last save
    skipped_steps: int = 0  # steps skipped so far (non-finite, or spikes with trainer.spikes.action=skip|stop)
    nonfinite_in_a_row: int = 0
    last_loss: Optional[float] = None
    last_val_loss: Optional[float] = None
    wandb_id: str = ""
    spikes: SpikeHistory = field(default_factory=SpikeHistory)  # the spike test's windows and counts (spikes.py)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainState:
        d = {"loss_tokens": d["tokens"], **d}  # checkpoints from before loss masks counted every target
        return cls(**{**d, "spikes": SpikeHistory(**d.get("spikes", {}))})  # before spike tests: an empty window


class Resumable:
    """The resumable state of a launch. A checkpoint holds it twice over: `client_state()` (in DeepSpeed's model
    states: TrainState, the data states and RNG states of all ranks, the resolved config, the world size, the
    schedule position) and `meta()` (meta.json: what diffllm.runs reads without torch: step, tokens, world size,
    ZeRO stage, the model config). `restore()` puts a checkpoint's client state back. `cfg`: the config trained (its
    `resolved` is saved); `ctx`: the launch (world size, budget)."""

    def __init__(self, cfg: TrainConfig, ctx: LaunchContext, state: TrainState, loader):
        self.cfg, self.world_size, self.total_steps = cfg, ctx.world_size, ctx.budget.steps
        self.state, self.loader = state, loader

    def client_state(self) -> dict:
        """Collective (every rank's loader and RNG states are gathered)."""
        return {
            "diffllm": {
                "train_state": self.state.to_dict(),
                "data": all_gather_object(self.loader.state_dict()),  # every rank's view; the loader restores from all
                "rng": all_gather_object(rng_state()),
                "config": self.cfg.resolved,
                "world_size": self.world_size,
                "schedule": {"name": self.cfg.optim.schedule, "step": self.state.step, "total_steps": self.total_steps},
            }
        }

    def meta(self) -> dict:
        s = self.state
        return {
            "step": s.step,
            "tokens": s.tokens,
            "world_size": self.world_size,
            "zero_stage": self.cfg.trainer.zero_stage,
            "saved_at": time.time(),
            "model": asdict(self.cfg.model),
        }

    @staticmethod
    def saved(client: dict) -> Optional[dict]:
        """Our part of a loaded checkpoint's client state (None: weights alone, as `diffllm import` writes them)."""
        return client.get("diffllm")

    def check(self, saved: dict) -> None:
        """Refuse, before anything is loaded or written, a data state this launch's loader cannot restore exactly
        (the check `restore` makes: e.g. a world size that does not divide its streams)."""
        from ...data.loader import check_states

        if self.loader.cfg.resume:
            check_states(saved["data"], self.loader)

    def restore(self, saved: dict, rank: int) -> None:
        """Counters, the data stream (raises, naming the problem, if it cannot resume exactly) and this rank's RNGs."""
        self.state = TrainState.from_dict(saved["train_state"])
        self.loader.load_state_dict(saved["data"])
        set_rng_state(saved["rng"], rank)
