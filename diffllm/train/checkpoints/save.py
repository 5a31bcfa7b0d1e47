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
from typing import Optional

import numpy as np
import torch

from ...errors import UserError
from ...runfiles import (
    NO_SPACE,
    REFUSED_GLOBAL,
    NoSpace,
    Refused,
    disk_full,
    exception_line,
    free_space,
    weights_only,
)
from ...runs import Checkpoint, Run, damaged_checkpoint
from ..dist import barrier, rank

# What torch's checkpoint writer raises when a write fails. It names no errno: a full disk reads "[enforce fail at
# inline_container.cc:672] . unexpected pos 1211776 vs 1211664" (torch 2.13), or "basic_ios::clear: iostream error".
WRITE_FAILED = ("inline_container", "PytorchStreamWriter", "iostream error", "file write failed")


class CheckpointManager:
    """Saving side of run_dir/checkpoints: DeepSpeed writes, diffllm.runs publishes (Run.publish, Run.prune)."""

    def __init__(self, run_dir: Path, keep_last: int, pinned: tuple[str, ...] = ()):
        self.run = Run(run_dir)
        self.dir = self.run.checkpoints_dir
        self.keep_last, self.pinned = keep_last, pinned  # pinned: tags never pruned (a WSD run's branch points)

    def save(self, engine, step: int, client_state: dict, meta: dict) -> str:
        """Collective. Every rank writes its shards into tmp-step<N>; rank 0 then publishes and prunes. Whatever stops
        a save, rank 0 removes tmp-step<N> and `latest` names the last complete checkpoint still; a write that fails (a
        full disk, a quota) is one line naming the folder and the free space (UserError: exit 2)."""
        tag, tmp = f"step{step}", f"tmp-step{step}"
        try:
            engine.save_checkpoint(str(self.dir), tag=tmp, client_state=client_state, save_latest=False)
            barrier()
            if rank() == 0:
                self.run.publish(tmp, tag, meta)
                self.run.prune(self.keep_last, keep=tag, pinned=self.pinned)
        except BaseException as e:
            why = write_failure(e, self.dir / tmp)
            space = free_space(self.dir)  # as the save found it, before its partial files are removed
            if rank() == 0:
                shutil.rmtree(self.dir / tmp, ignore_errors=True)
            if why is None:
                raise
            last = self.run.latest()
            raise UserError(
                f"checkpoint: cannot save step {step} in {self.dir / tmp}: {why} ({space}); removed it, and the last "
                f"checkpoint {last.path if last else '(none)'} is intact: free some space and relaunch the same "
                f"command to continue from it"
            ) from None
        barrier()
        return tag

    def load(self, engine, res: Checkpoint, universal: bool) -> tuple[dict, str]:
        """Collective. DeepSpeed loads `res` (through its universal conversion when `universal`) -> (client state,
        tag); a damaged checkpoint is a one-line ValueError naming it. DeepSpeed's loader reads every file
        weights-only (runfiles.weights_only): one whose pickle would run code is refused in one line."""
        tag = self.to_universal(res) if universal else res.tag
        try:
            with weights_only():
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
                "diffllm.train.universal",  # DeepSpeed's ds_to_universal, reading weights-only
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
            if done.returncode and "Weights only load failed" in done.stderr:
                raise Refused(res.path, REFUSED_GLOBAL.findall(done.stderr) or ["an object outside the allow-list"])
            if done.returncode:
                raise RuntimeError(
                    f"ds_to_universal failed on {res.dir / res.tag}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
                )
            Run(res.dir.parent).publish_universal(res, tmp)
        barrier()
        return out


def write_failure(e: BaseException, folder: Path) -> Optional[str]:
    """Why a save failed when it was a write that failed (None for anything else: a lost peer, a bug, Ctrl-C): a full
    file system or quota (`No space left on device`: errno, or a probe in `folder` when torch's writer names none),
    else the write's own error."""
    if isinstance(e, NoSpace):
        return e.why
    if isinstance(e, OSError) and e.errno in NO_SPACE:
        return e.strerror
    wrote = isinstance(e, OSError) and not isinstance(e, ConnectionError)  # a socket's error is a lost peer's
    if wrote or (isinstance(e, RuntimeError) and any(s in str(e) for s in WRITE_FAILED)):
        return disk_full(folder) or f"a write failed ({exception_line(e)})"
    return None


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
