"""The one dict a resume needs besides DeepSpeed's own files, and the run directory's bookkeeping around it."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from .checkpoint import write_atomic

RUN_FILES = ("checkpoints", "metrics.jsonl", "summary.json", "wandb")


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


def move_aside(run_dir: Path, why: str) -> Optional[Path]:
    """Rank 0: a fresh start in a used run_dir moves the old run's files into run_dir/replaced-<time>/ (never deletes)."""
    present = [run_dir / n for n in RUN_FILES if (run_dir / n).exists()]
    if not present:
        return None
    dest = run_dir / time.strftime("replaced-%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for p in present:
        shutil.move(str(p), str(dest / p.name))
    print(f"[diffllm.train] {why}: moved the previous run's {', '.join(p.name for p in present)} to {dest}", flush=True)
    return dest


def write_summary(run_dir: Path, summary: dict) -> None:
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
