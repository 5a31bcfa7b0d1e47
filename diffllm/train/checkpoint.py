"""Checkpoints in run_dir/checkpoints: DeepSpeed save/load, atomic publishing, keep-last-K, universal conversion.

Layout: `step<N>/` (a DeepSpeed tag folder plus our `meta.json`), `latest` (the tag to resume from), and
`step<N>_universal/` when a resume on a different world size converted one. A save goes to `tmp-step<N>/` first;
only when every rank has finished writing does rank 0 rename it and then replace `latest` atomically, so a save
killed half-way leaves `latest` pointing at the previous complete checkpoint.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .dist import barrier, rank

TAG = re.compile(r"^step(\d+)$")


@dataclass(frozen=True)
class Resume:
    """Where a run continues from: `dir` holds the tag folder `tag`; `meta` is its meta.json."""

    dir: Path
    tag: str
    meta: dict

    @property
    def step(self) -> int:
        return int(self.meta["step"])


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(tag_dir: Path) -> dict:
    path = tag_dir / "meta.json"
    if not path.is_file():
        raise ValueError(f"{tag_dir}: not a diffllm checkpoint (no meta.json); pass a step<N> folder or a checkpoints folder")
    return json.loads(path.read_text())


def find_resume(path: Path) -> Optional[Resume]:
    """`path` is a checkpoints folder (its `latest` is used) or one tag folder. None if the folder holds none."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return Resume(path.parent, path.name, read_meta(path))
    latest = path / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    if not (path / tag).is_dir():
        raise ValueError(f"{latest}: points at {tag!r}, which does not exist in {path}")
    return Resume(path, tag, read_meta(path / tag))


class CheckpointManager:
    def __init__(self, run_dir: Path, keep_last: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def tags(self) -> list[tuple[int, str]]:
        """Published checkpoints, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p.name) for p in self.dir.iterdir() if p.is_dir() and (m := TAG.match(p.name))]
        return sorted(found)

    def latest(self) -> Optional[Resume]:
        return find_resume(self.dir) if self.dir.is_dir() else None

    def remove_partial(self) -> None:
        """Rank 0, at start-up: folders of saves that were interrupted (never published) are deleted."""
        for p in sorted(self.dir.glob("tmp-*")) if self.dir.is_dir() else []:
            print(f"checkpoint: removing {p} (a save that never completed)", flush=True)
            shutil.rmtree(p, ignore_errors=True)

    def save(self, engine, step: int, client_state: dict, meta: dict) -> str:
        """Collective. Every rank writes its shards into tmp-step<N>; rank 0 then publishes and prunes."""
        tag, tmp = f"step{step}", f"tmp-step{step}"
        engine.save_checkpoint(str(self.dir), tag=tmp, client_state=client_state, save_latest=False)
        barrier()
        if rank() == 0:
            write_atomic(self.dir / tmp / "meta.json", json.dumps(meta, indent=1))
            if (self.dir / tag).exists():  # the same step saved again (e.g. a resumed run stopped at once)
                shutil.rmtree(self.dir / tag)
            os.rename(self.dir / tmp, self.dir / tag)
            write_atomic(self.dir / "latest", tag)
            self.prune(keep=tag)
        barrier()
        return tag

    def prune(self, keep: str) -> None:
        """Delete all but the newest `keep_last` checkpoints (and their universal conversions); never `keep`."""
        tags = [t for _, t in self.tags()]
        for t in tags[: max(0, len(tags) - self.keep_last)]:
            if t != keep:
                shutil.rmtree(self.dir / t, ignore_errors=True)
                shutil.rmtree(self.dir / f"{t}_universal", ignore_errors=True)

    @staticmethod
    def to_universal(res: Resume) -> str:
        """Collective. DeepSpeed's ds_to_universal on rank 0 (once; reused if present) -> the universal tag."""
        out = f"{res.tag}_universal"
        if rank() == 0 and not (res.dir / out).is_dir():
            tmp = res.dir / f"tmp-{out}"
            shutil.rmtree(tmp, ignore_errors=True)
            cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--inject_missing_state",
                   "--num_extract_workers", "1", "--num_merge_workers", "1",
                   "--input_folder", str(res.dir / res.tag), "--output_folder", str(tmp)]
            print(f"checkpoint: converting {res.dir / res.tag} to a universal checkpoint (world size changed)", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"ds_to_universal failed on {res.dir / res.tag}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
            os.rename(tmp, res.dir / out)
            write_atomic(res.dir / "latest_universal", out)  # DeepSpeed's convention; it wrote the tmp name
        barrier()
        return out


def consolidated_model(tag_dir: Path):
    """DecoderLM with the fp32 weights of a checkpoint, gathered from its ZeRO shards by DeepSpeed's zero_to_fp32
    (any stage, any world size) and the model config recorded in its meta.json."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from ..model import DecoderLM, ModelConfig

    tag_dir = Path(tag_dir)
    model = DecoderLM(ModelConfig(**read_meta(tag_dir)["model"]))
    state = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    model.load_state_dict(state, strict=True)
    return model


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(states: list[dict], my_rank: int) -> None:
    """Restore this rank's generators from the saving run's per-rank states; a rank the saving run did not have
    keeps its fresh seed, which is said, not hidden."""
    if my_rank >= len(states):
        warnings.warn(f"rank {my_rank}: the checkpoint holds RNG states of {len(states)} ranks; this rank keeps its seed")
        return
    s = states[my_rank]
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])
