"""The one dict a resume needs besides DeepSpeed's own files (the run directory itself is diffllm.runs')."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional


@dataclass
class TrainState:
    """Counters that move with every step. Saved in each checkpoint's client_state together with the data states
    and RNG states of all ranks, the resolved config and the world size (see Trainer.client_state)."""

    step: int = 0  # optimizer steps done (skipped non-finite steps included: they consumed their data)
    tokens: int = 0  # training tokens consumed = step x global_batch_tokens
    elapsed_s: float = 0.0  # wall time of all launches together, up to the last save
    skipped_steps: int = 0  # non-finite steps skipped so far
    nonfinite_in_a_row: int = 0
    last_loss: Optional[float] = None
    last_val_loss: Optional[float] = None
    wandb_id: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainState":
        return cls(**d)
