"""Saving checkpoints in run_dir/checkpoints: DeepSpeed save, atomic publishing, keep-last-K, universal conversion,
RNG states.

Layout: `step<N>/` (a DeepSpeed tag folder plus our `meta.json`), `latest` (the tag to resume from), and
`step<N>_universal/` when a resume on a different world size converted one. A save goes to `tmp-step<N>/` first;
only when every rank has finished writing does rank 0 publish it (diffllm.runs: Run.publish renames it and then
replaces `latest` atomically), so a save killed half-way leaves `latest` pointing at the previous complete checkpoint.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..runs import Checkpoint, Run, damaged_checkpoint
from .dist import barrier, rank


class CheckpointManager:
    """Saving side of run_dir/checkpoints: DeepSpeed writes, diffllm.runs publishes (Run.publish, Run.prune)."""

    def __init__(self, run_dir: Path, keep_last: int, pinned: tuple[str, ...] = ()):
        self.run = Run(run_dir)
        self.dir = self.run.checkpoints_dir
        self.keep_last, self.pinned = keep_last, pinned  # pinned: tags never pruned (a WSD run's branch points)

    def save(self, engine, step: int, client_state: dict, meta: dict) -> str:
        """Collective. Every rank writes its shards into tmp-step<N>; rank 0 then publishes and prunes."""
        tag, tmp = f"step{step}", f"tmp-step{step}"
        engine.save_checkpoint(str(self.dir), tag=tmp, client_state=client_state, save_latest=False)
        barrier()
        if rank() == 0:
            self.run.publish(tmp, tag, meta)
            self.run.prune(self.keep_last, keep=tag, pinned=self.pinned)
        barrier()
        return tag

    def load(self, engine, res: Checkpoint, universal: bool) -> tuple[dict, str]:
        """Collective. DeepSpeed loads `res` (through its universal conversion when `universal`) -> (client state,
        tag); a damaged checkpoint is a one-line ValueError naming it."""
        tag = self.to_universal(res) if universal else res.tag
        try:
            path, client = engine.load_checkpoint(str(res.dir), tag=tag, load_lr_scheduler_states=False)
        except Exception as e:  # noqa: BLE001 - torch/DeepSpeed raise many types for a damaged file
            raise damaged_checkpoint(res.dir / tag, e) from None
        if path is None:
            raise UserError(f"{res.dir / tag}: DeepSpeed found no checkpoint files there; the checkpoint is damaged")
        return client, tag

    @staticmethod
    def to_universal(res: Checkpoint) -> str:
        """Collective. DeepSpeed's ds_to_universal on rank 0 (once; reused if present) -> the universal tag."""
        out = f"{res.tag}_universal"
        if rank() == 0 and not (res.dir / out).is_dir():
            tmp = res.dir / f"tmp-{out}"
            shutil.rmtree(tmp, ignore_errors=True)
            cmd = [
                sys.executable,
                "-m",
                "deepspeed.checkpoint.ds_to_universal",
                "--inject_missing_state",
                "--num_extract_workers",
                "1",
                "--num_merge_workers",
                "1",
                "--input_folder",
                str(res.dir / res.tag),
                "--output_folder",
                str(tmp),
            ]
            print(
                f"checkpoint: converting {res.dir / res.tag} to a universal checkpoint (world size changed)", flush=True
            )
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(
                    f"ds_to_universal failed on {res.dir / res.tag}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
                )
            Run(res.dir.parent).publish_universal(res, tmp)
        barrier()
        return out


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(states: list[dict], my_rank: int) -> None:
    """Restore this rank's generators from the saving run's per-rank states; a rank the saving run did not have
    keeps its fresh seed, which is said, not hidden."""
    if my_rank >= len(states):
        warnings.warn(
            f"rank {my_rank}: the checkpoint holds RNG states of {len(states)} ranks; this rank keeps its seed",
            stacklevel=2,
        )
        return
    s = states[my_rank]
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])
