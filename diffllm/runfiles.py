"""A run directory's files, read and written one way: atomic writes, JSON and metrics.jsonl readers, the one-line
errors for damaged files, and the checkpoints (`Checkpoint`, meta.json, `latest`). diffllm/runs.py's `Run` builds on
these; everything here is light (no torch until a checkpoint's client state is read)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .errors import UserError

TAG = re.compile(r"^step(\d+)$")
MODEL_STATES = (
    "mp_rank_00_model_states.pt"  # DeepSpeed's module weights (complete under ZeRO 0-2, placeholders under 3)
)
METRICS_FILE = "metrics.jsonl"


def write_atomic(path: Path, text: str) -> None:
    """Write aside, fsync, rename: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def exception_line(e: BaseException, limit: int = 240) -> str:
    """`Type: message` on one line for an error message: the exception's first line whole, or, when that is longer
    than `limit`, its first sentences that fit (a cut mid-sentence ends at a word, marked with "...")."""
    text = " ".join(str(e).split("\n", 1)[0].split())
    if len(text) > limit:
        ends = [i + 1 for i in range(limit) if text[i] == "." and (i + 1 == len(text) or text[i + 1] == " ")]
        text = text[: ends[-1]] if ends else text[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def damaged_checkpoint(path: Path, e: BaseException) -> UserError:
    """The one-line error for a checkpoint that torch or DeepSpeed cannot read."""
    return UserError(
        f"{path}: cannot load this checkpoint ({exception_line(e)}); the checkpoint is damaged: resume "
        f"an earlier one with trainer.resume=<its step folder>"
    )


def read_json(path: Path) -> Any:
    """A JSON file, or a one-line ValueError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); the file is damaged") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file; the file is damaged") from None


def config_hash(config: dict) -> str:
    """A short fingerprint of a resolved config (its canonical JSON): what a branch records of its parent."""
    import hashlib

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_metrics(run_dir: Union[str, Path]) -> list[dict]:
    """The records of `<run_dir>/metrics.jsonl` ([] without the file); see `parse_metrics`."""
    path = Path(run_dir) / METRICS_FILE
    return parse_metrics(path.read_text(), path) if path.exists() else []


def parse_metrics(text: str, path: Path) -> list[dict]:
    """The records of metrics.jsonl's `text`. The trainer appends one line per record, so a kill can leave the last
    line cut short: that line is left out (its step is recomputed on resume). A bad line anywhere else is a one-line
    ValueError naming the file (`path`) and the line: the file is damaged, nothing is skipped."""
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:  # no newline after it: a write cut short
                break
            raise UserError(f"{path}: line {i + 1} is not valid JSON ({e.msg}); the file is damaged") from None
    return records


@dataclass(frozen=True)
class Checkpoint:
    """One published checkpoint: the tag folder `dir / tag` and its meta.json."""

    dir: Path  # the checkpoints folder
    tag: str  # step<N> (or step<N>_universal)
    meta: dict

    @property
    def path(self) -> Path:
        return self.dir / self.tag

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def zero_stage(self) -> int:
        return int(self.meta.get("zero_stage", 0))

    def client_state(self) -> dict:
        """What was saved beside the weights in rank 0's DeepSpeed model-states file (the trainer's resumable state
        is under "diffllm"; a `diffllm import` checkpoint has none), read before any engine exists and without
        reading the weights (memory-mapped); a damaged file is a one-line ValueError."""
        import torch

        states = self.path / (MODEL_STATES if self.zero_stage < 3 else f"zero_pp_rank_0_{MODEL_STATES}")
        if not states.is_file():
            raise UserError(f"{self.path}: no {states.name} (an incomplete or foreign checkpoint)")
        try:
            try:
                state = torch.load(states, map_location="cpu", weights_only=False, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = torch.load(states, map_location="cpu", weights_only=False)  # not a zip file: the real error
        except Exception as e:  # noqa: BLE001 - torch raises many types for a damaged file
            raise damaged_checkpoint(self.path, e) from None
        return {k: v for k, v in state.items() if k not in ("module", "optimizer")} if isinstance(state, dict) else {}


def read_meta(tag_dir: Path) -> dict:
    path = Path(tag_dir) / "meta.json"
    if not path.is_file():
        raise UserError(
            f"{tag_dir}: not a diffllm checkpoint (no meta.json); pass a step<N> folder, a checkpoints "
            f"folder or a run directory"
        )
    meta = read_json(path)
    if not isinstance(meta, dict) or "step" not in meta or "model" not in meta:
        raise UserError(f"{path}: not a diffllm checkpoint's meta.json (no step or model); the file is damaged")
    return meta


def find_checkpoint(path: Path) -> Optional[Checkpoint]:
    """`path` is a checkpoints folder (its `latest` is used) or one tag folder; None if the folder holds none."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return Checkpoint(path.parent, path.name, read_meta(path))
    latest = path / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    if not (path / tag).is_dir():
        raise UserError(f"{latest}: points at {tag!r}, which does not exist in {path}")
    return Checkpoint(path, tag, read_meta(path / tag))
