"""The run directory, one owner: its files, its checkpoints, and a trained model loaded back from any ZeRO stage.

    <run_dir>/
      config.yaml              the resolved config of the run (the tokenizer path in it points at tokenizer.json)
      tokenizer.json           the run's tokenizer: a run directory decodes, evaluates and exports on another machine
      metrics.jsonl            one JSON record per log line and per validation
      summary.json             written when the run reaches its token budget; never rewritten after that
      checkpoints/latest       the tag to resume from (replaced atomically)
      checkpoints/step<N>/     DeepSpeed's files + our meta.json (step, tokens, world size, ZeRO stage, model config)

The trainer, sweeps, evaluation and export all use this module; it imports nothing from `diffllm.train` (whose import
sets process-wide environment defaults), so loading a trained model is cheap and side-effect free:

    cfg, model, tok = Run("runs/diff-tiny").model()            # the latest checkpoint, fp32 on CPU, eval mode
    cfg, model, tok = Run("runs/diff-tiny/checkpoints/step64").model()
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

TAG = re.compile(r"^step(\d+)$")
MODEL_STATES = "mp_rank_00_model_states.pt"  # DeepSpeed's module weights (complete under ZeRO 0-2, placeholders under 3)
CONFIG_FILE, TOKENIZER_FILE, SUMMARY_FILE, METRICS_FILE = "config.yaml", "tokenizer.json", "summary.json", "metrics.jsonl"
RUN_FILES = ("checkpoints", METRICS_FILE, SUMMARY_FILE, CONFIG_FILE, TOKENIZER_FILE, "wandb")  # what a run owns


def write_atomic(path: Path, text: str) -> None:
    """Write aside, fsync, rename: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """A JSON file, or a one-line ValueError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); the file is damaged") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file; the file is damaged") from None


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
            raise ValueError(f"{path}: line {i + 1} is not valid JSON ({e.msg}); the file is damaged") from None
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


def read_meta(tag_dir: Path) -> dict:
    path = Path(tag_dir) / "meta.json"
    if not path.is_file():
        raise ValueError(f"{tag_dir}: not a diffllm checkpoint (no meta.json); pass a step<N> folder, a checkpoints "
                         f"folder or a run directory")
    meta = read_json(path)
    if not isinstance(meta, dict) or "step" not in meta or "model" not in meta:
        raise ValueError(f"{path}: not a diffllm checkpoint's meta.json (no step or model); the file is damaged")
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
        raise ValueError(f"{latest}: points at {tag!r}, which does not exist in {path}")
    return Checkpoint(path, tag, read_meta(path / tag))


class Run:
    """A run directory (or a path inside it: its checkpoints folder, or one step<N> folder, which pins that step)."""

    def __init__(self, path: Union[str, Path]):
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"{path}: is a file, not a run directory")
        self.pinned: Optional[Checkpoint] = None
        if (path / "meta.json").is_file():  # a tag folder: <run>/checkpoints/step<N>
            self.pinned = find_checkpoint(path)
            path = path.parent.parent
        elif path.name == "checkpoints" and not (path / "checkpoints").exists():
            path = path.parent
        self.dir = path
        self.checkpoints_dir = path / "checkpoints"

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r})"

    # ----- files ---------------------------------------------------------------------------------------------------
    def summary_path(self) -> Path:
        return self.dir / SUMMARY_FILE

    def summary(self) -> Optional[dict]:
        path = self.summary_path()
        return read_json(path) if path.is_file() else None

    def is_finished(self) -> bool:
        return (self.summary() or {}).get("status") == "finished"

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.dir / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")

    def write_config(self, config: dict) -> None:
        """config.yaml: the resolved config, its tokenizer path pointing at the run's own tokenizer.json."""
        import yaml

        config = json.loads(json.dumps(config))  # a deep copy of plain containers
        config.setdefault("data", {}).setdefault("tokenizer", {})["path"] = str(self.dir / TOKENIZER_FILE)
        write_atomic(self.dir / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))

    def write_tokenizer(self, text: str) -> None:
        """tokenizer.json (its JSON text), atomically: the run decodes without the cache it came from."""
        path = self.dir / TOKENIZER_FILE
        if not path.is_file() or path.read_text() != text:
            write_atomic(path, text)

    def files(self) -> list[Path]:
        """The files of a run present in the directory (RUN_FILES): empty for a new or emptied run_dir."""
        return [self.dir / n for n in RUN_FILES if (self.dir / n).exists()]

    def move_aside(self, why: str) -> Optional[Path]:
        """A fresh start in a used run_dir moves the old run's files into run_dir/replaced-<time>/ (never deletes)."""
        present = self.files()
        if not present:
            return None
        dest = self.dir / time.strftime("replaced-%Y%m%d-%H%M%S")
        dest.mkdir(parents=True, exist_ok=True)
        for p in present:
            shutil.move(str(p), str(dest / p.name))
        print(f"[diffllm.train] {why}: moved the previous run's {', '.join(p.name for p in present)} to {dest}",
              flush=True)
        return dest

    def config(self) -> Optional[dict]:
        """The run's resolved config (config.yaml), or None for a run written before runs kept one."""
        from omegaconf import OmegaConf

        path = self.dir / CONFIG_FILE
        if not path.is_file():
            return None
        try:
            return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as e:  # noqa: BLE001 - any parse failure means a damaged file
            raise ValueError(f"{path}: not a readable YAML config ({type(e).__name__}); the file is damaged") from None

    # ----- checkpoints ---------------------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Published checkpoints' steps, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.checkpoints_dir.iterdir()
                      if p.is_dir() and (m := TAG.match(p.name)))

    def latest(self) -> Optional[Checkpoint]:
        return find_checkpoint(self.checkpoints_dir) if self.checkpoints_dir.is_dir() else None

    def checkpoint(self, step: Union[int, str] = "latest") -> Checkpoint:
        """The checkpoint at `step` ("latest", or an int), or a one-line ValueError saying what there is."""
        if self.pinned is not None and step == "latest":
            return self.pinned
        if step == "latest":
            found = self.latest()
            if found is None:
                raise ValueError(f"{self.dir}: no checkpoints (train it first, or pass a run directory that has "
                                 f"checkpoints/)")
            return found
        try:
            step = int(step)
        except ValueError:
            raise ValueError(f"step={step!r}: expected latest or a step number") from None
        if step not in self.steps():
            have = ", ".join(map(str, self.steps())) or "none"
            raise ValueError(f"step={step}: {self.dir} has no checkpoint at that step (steps: {have})")
        return Checkpoint(self.checkpoints_dir, f"step{step}", read_meta(self.checkpoints_dir / f"step{step}"))

    # ----- a trained model -----------------------------------------------------------------------------------------
    def tokenizer(self):
        """The run's own tokenizer.json; for an older run, the tokenizer its config points at."""
        from .data import load_tokenizer

        cfg = self.config() or {}
        tok_cfg = (cfg.get("data") or {}).get("tokenizer") or {}
        eos = tok_cfg.get("eos_token", "<|endoftext|>")
        own = self.dir / TOKENIZER_FILE
        if own.is_file():
            return load_tokenizer(str(own), eos)
        if tok_cfg.get("path"):
            return load_tokenizer(tok_cfg["path"], eos)
        raise ValueError(f"{self.dir}: no {TOKENIZER_FILE} in the run directory and no data.tokenizer.path in its "
                         f"config (a run from before runs kept their tokenizer: pass the tokenizer explicitly)")

    def model(self, step: Union[int, str] = "latest", device: str = "cpu", tokenizer: bool = True):
        """(ModelConfig, DecoderLM in eval mode with the checkpoint's fp32 weights, Tokenizer or None)."""
        from .model import DecoderLM, ModelConfig

        ckpt = self.checkpoint(step)
        try:
            cfg = ModelConfig(**ckpt.meta["model"])
        except TypeError as e:
            raise ValueError(f"{ckpt.path / 'meta.json'}: its model config does not fit this diffllm ({e})") from None
        model = DecoderLM(cfg)
        missing, unexpected = model.load_state_dict(consolidated_state_dict(ckpt), strict=False)
        if missing or unexpected:
            raise ValueError(f"{ckpt.path}: weights do not fit {cfg.name} ({cfg.arch}): missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
        return cfg, model.to(device).eval(), (self.tokenizer() if tokenizer else None)


def consolidated_state_dict(ckpt: Checkpoint) -> dict:
    """fp32 weights of a checkpoint of any ZeRO stage and world size: ZeRO-0 keeps whole weights in its model-states
    file; ZeRO 1-3 are gathered from their fp32 optimizer shards by DeepSpeed's zero_to_fp32."""
    import torch

    states = ckpt.path / MODEL_STATES  # ZeRO-3 names it zero_pp_rank_<r>_mp_rank_00_model_states.pt, one per rank
    if not (states.is_file() or any(ckpt.path.glob(f"*_{MODEL_STATES}"))):
        raise ValueError(f"{ckpt.path}: no {MODEL_STATES} (an incomplete or foreign checkpoint)")
    try:
        if ckpt.zero_stage == 0:
            module = torch.load(states, map_location="cpu", weights_only=False)["module"]
            return {k: v.float() for k, v in module.items()}
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt.dir), tag=ckpt.tag))
    except Exception as e:  # noqa: BLE001 - torch/DeepSpeed raise many types for a damaged file
        raise ValueError(f"{ckpt.path}: cannot read its weights ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                         f"the checkpoint is damaged: use an earlier step") from None
