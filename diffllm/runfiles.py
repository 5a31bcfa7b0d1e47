"""A run directory's files, read and written one way: atomic writes, JSON and metrics.jsonl readers, the one-line
errors for damaged files, and the checkpoints (`Checkpoint`, meta.json, `latest`). diffllm/runs.py's `Run` builds on
these; everything here is light (no torch until a checkpoint's client state is read)."""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

from .errors import UserError

TAG = re.compile(r"^step(\d+)$")
MODEL_STATES = (
    "mp_rank_00_model_states.pt"  # DeepSpeed's module weights (complete under ZeRO 0-2, placeholders under 3)
)
METRICS_FILE = "metrics.jsonl"


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full file system, or the user's quota on it


def write_atomic(path: Path, text: str) -> None:
    """Write aside, fsync, rename: a reader sees the old file or the new one, never half of one. A full disk is a
    one-line error naming the file and the free space, and leaves no half-written file aside."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in NO_SPACE:
            raise no_space(path, e.strerror) from None
        raise


def free_space(path: Path) -> str:
    """`1.2 MiB free of 6.0 MiB` on the file system that holds `path` (or its nearest existing parent)."""
    path = next((p for p in (Path(path), *Path(path).parents) if p.exists()), Path("/"))
    usage = shutil.disk_usage(path)
    return f"{_bytes(usage.free)} free of {_bytes(usage.total)}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def disk_full(folder: Path) -> Optional[str]:
    """After a write failed in `folder`: whether its file system has no room left (or the quota is reached), told
    by a probe of 1 MiB written and synced there: its error text (`No space left on device`), or None when the
    probe fits. torch's own writer says only `unexpected pos 1211776 vs 1211664` or `iostream error` for that."""
    folder = next((p for p in (Path(folder), *Path(folder).parents) if p.is_dir()), Path("/"))
    probe = folder / f".diffllm-space-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(2**20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e.strerror if e.errno in NO_SPACE else None
    finally:
        probe.unlink(missing_ok=True)
    return None


class NoSpace(UserError):
    """A write into a run directory found no room: one line naming the file and the free space."""

    def __init__(self, path: Path, why: str):
        self.why = why
        super().__init__(f"{path}: cannot write it: {why} ({free_space(path)}); free some space and relaunch")


def no_space(path: Path, why: str = "No space left on device") -> NoSpace:
    return NoSpace(path, why)


def exception_line(e: BaseException, limit: int = 240) -> str:
    """`Type: message` on one line for an error message: the exception's first line whole, or, when that is longer
    than `limit`, its first sentences that fit (a cut mid-sentence ends at a word, marked with "...")."""
    text = " ".join(str(e).split("\n", 1)[0].split())
    if len(text) > limit:
        ends = [i + 1 for i in range(limit) if text[i] == "." and (i + 1 == len(text) or text[i + 1] == " ")]
        text = text[: ends[-1]] if ends else text[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# What checkpoints hold beside tensors and plain containers, by the name their pickles give it -> where it is imported
# from (the first that exists): numpy arrays (the RNG states diffllm saves), and DeepSpeed's loss scaler, ZeRO stage
# and fragment addresses (its optimizer states). Nothing else is unpickled: torch.load(weights_only=True) builds only
# tensors, containers, numbers, strings and these; a pickle that names anything else (os.system, a class whose
# constructor runs code) is refused before any of it runs.
_RECONSTRUCT = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct")  # numpy 2, numpy 1
SAFE_GLOBALS = {
    "numpy._core.multiarray._reconstruct": _RECONSTRUCT,
    "numpy.core.multiarray._reconstruct": _RECONSTRUCT,
    "numpy.ndarray": ("numpy.ndarray",),
    "numpy.dtype": ("numpy.dtype",),
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": ("deepspeed.runtime.fp16.loss_scaler.LossScaler",),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": ("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",),
    "deepspeed.runtime.zero.config.ZeroStageEnum": ("deepspeed.runtime.zero.config.ZeroStageEnum",),
    "deepspeed.utils.tensor_fragment.fragment_address": ("deepspeed.utils.tensor_fragment.fragment_address",),
}
REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _safe(names: Iterable[str]) -> list[tuple[Any, str]]:
    """(object, name) pairs for torch's safe_globals: each of `names` (SAFE_GLOBALS keys) imported now."""
    out = []
    for name in names:
        for where in SAFE_GLOBALS[name]:
            module, _, attr = where.rpartition(".")
            try:
                out.append((getattr(importlib.import_module(module), attr), name))
                break
            except (ImportError, AttributeError):
                continue
    if "numpy.dtype" in names:  # an array's dtype is built from numpy.dtype, then given its state as its own class
        import numpy.dtypes

        out += [
            (c, f"numpy.dtypes.{n}")
            for n, c in vars(numpy.dtypes).items()
            if isinstance(c, type) and n.endswith("DType")
        ]
    return out


class Refused(UserError):
    """A checkpoint file whose pickle names something no checkpoint holds: not loaded, nothing of it run."""

    def __init__(self, path: Path, names: list[str]):
        super().__init__(
            f"{path}: refused: its pickle calls {', '.join(names[:3])}, which no checkpoint of diffllm or DeepSpeed "
            f"holds (loading it could run code; nothing of it was run): a run directory from elsewhere may carry "
            f"code; use one you trust"
        )


def refused(path: Path, e: BaseException) -> Optional[Refused]:
    """The refusal for a weights-only load that met a global outside the allow-list (torch's UnpicklingError), or
    None for any other error."""
    if not (isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e)):
        return None
    return Refused(path, REFUSED_GLOBAL.findall(str(e)) or ["an object outside the allow-list"])


def load_states(path: Path, mmap: bool = False) -> Any:
    """A checkpoint file read with torch.load(weights_only=True) and SAFE_GLOBALS: the globals its pickle names are
    listed first without running any (torch's get_unsafe_globals_in_checkpoint), so a planted one is refused naming
    it, and DeepSpeed's classes are imported only when a file names them."""
    import torch

    names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    unknown = [n for n in names if n not in SAFE_GLOBALS]
    if unknown:
        raise Refused(path, unknown)
    with torch.serialization.safe_globals(_safe(names)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            raise (refused(path, e) or e) from None


@contextlib.contextmanager
def weights_only() -> Iterator[None]:
    """For DeepSpeed's own loaders (engine.load_checkpoint, zero_to_fp32, ds_to_universal), which call
    torch.load with weights_only off: every torch.load in the block is made weights-only (TORCH_FORCE_WEIGHTS_ONLY_LOAD,
    which torch reads at each call and which overrides the caller's argument), with SAFE_GLOBALS allowed. A planted
    pickle fails with torch's UnpicklingError, which `refused` turns into one line."""
    import torch

    key, before = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ[key] = "1"
    try:
        with torch.serialization.safe_globals(_safe(SAFE_GLOBALS)):
            yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def damaged_checkpoint(path: Path, e: BaseException) -> UserError:
    """The one-line error for a checkpoint that torch or DeepSpeed cannot read (or refused: `refused`)."""
    if isinstance(e, UserError):
        return e
    if (refusal := refused(path, e)) is not None:
        return refusal
    return UserError(
        f"{path}: cannot load this checkpoint ({exception_line(e)}); the checkpoint is damaged: resume "
        f"an earlier one with trainer.resume=<its step folder>"
    )


def read_json(path: Path) -> Any:
    """A JSON file, or a one-line ValueError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise UserError(f"{path}: not valid JSON ({e.msg}: {where}); the file is damaged") from None
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

    def check_pickles(self) -> None:
        """Refuse (Refused, one line naming the file) a checkpoint with a file whose pickle names anything outside
        SAFE_GLOBALS: every .pt file of its folder and of its universal conversion, if any. Reads only the pickles
        (torch's get_unsafe_globals_in_checkpoint runs none of them, nor reads a tensor), so every rank reaches the
        same verdict before DeepSpeed, which reads some files on some ranks only, loads anything."""
        import torch

        for folder in (self.path, self.dir / f"{self.tag}_universal"):
            for f in sorted(folder.rglob("*.pt")) if folder.is_dir() else []:
                try:
                    names = torch.serialization.get_unsafe_globals_in_checkpoint(f)
                except Exception:  # noqa: BLE001 - a damaged file: its load says so
                    continue
                if unknown := [n for n in names if n not in SAFE_GLOBALS]:
                    raise Refused(f, unknown)

    def client_state(self) -> dict:
        """What was saved beside the weights in rank 0's DeepSpeed model-states file (the trainer's resumable state
        is under "diffllm"; a `diffllm import` checkpoint has none), read before any engine exists and without
        reading the weights (memory-mapped); a damaged file is a one-line ValueError."""

        states = self.path / (MODEL_STATES if self.zero_stage < 3 else f"zero_pp_rank_0_{MODEL_STATES}")
        if not states.is_file():
            raise UserError(f"{self.path}: no {states.name} (an incomplete or foreign checkpoint)")
        try:
            try:
                state = load_states(states, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = load_states(states)  # not a zip file: the real error
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
