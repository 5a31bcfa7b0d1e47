"""The run directory, one owner: its files, its checkpoints, and a trained model loaded back from any ZeRO stage.

    <run_dir>/
      config.yaml              the resolved config of the run (the tokenizer path in it points at tokenizer.json)
      tokenizer.json           the run's tokenizer: a run directory decodes, evaluates and exports on another machine
      metrics.jsonl            one JSON record per log line and per validation
      summary.json             written when the run reaches its token budget; never rewritten after that
      branch.json              a WSD cooldown branch only: its parent run, branch step and the parent's config hash
      checkpoints/latest       the tag to resume from (replaced atomically)
      checkpoints/step<N>/     DeepSpeed's files + our meta.json (step, tokens, world size, ZeRO stage, model config)

It (with diffllm/runfiles.py: atomic writes, the JSON readers, the checkpoints) is the one reader and writer of these
files (the trainer, `diffllm import`, sweeps, evaluation and export all go through it; every file is published
atomically: written aside, then renamed), and `choose_tokenizer` is the one decision of which tokenizer a run uses. It
imports nothing from `diffllm.train` (whose import sets process-wide
environment defaults), so loading a trained model is cheap and side-effect free:

    cfg, model, tok = Run("runs/diff-tiny").model()            # the latest checkpoint, fp32 on CPU, eval mode
    cfg, model, tok = Run("runs/diff-tiny/checkpoints/step64").model()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Collection, Optional, Union

from .errors import UserError
from .runfiles import (  # noqa: F401 - the run directory's file layer, imported from here too
    METRICS_FILE,
    MODEL_STATES,
    NO_SPACE,
    TAG,
    Checkpoint,
    config_hash,
    damaged_checkpoint,
    exception_line,
    find_checkpoint,
    load_states,
    no_space,
    parse_metrics,
    read_json,
    read_meta,
    read_metrics,
    refused,
    weights_only,
    write_atomic,
)

CONFIG_FILE, TOKENIZER_FILE, SUMMARY_FILE = "config.yaml", "tokenizer.json", "summary.json"
BRANCH_FILE = "branch.json"
RUN_FILES = (
    "checkpoints",
    METRICS_FILE,
    SUMMARY_FILE,
    CONFIG_FILE,
    TOKENIZER_FILE,
    BRANCH_FILE,
    "wandb",
)  # what a run owns


class Run:
    """A run directory (or a path inside it: its checkpoints folder, or one step<N> folder, which pins that step)."""

    def __init__(self, path: Union[str, Path]):
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"{path}: is a file, not a run directory")
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

    def branch(self) -> Optional[dict]:
        """branch.json: where a WSD cooldown branch started (parent run_dir, step, tokens, parent_config_hash), or
        None for a run that is no branch."""
        path = self.dir / BRANCH_FILE
        return read_json(path) if path.is_file() else None

    def write_branch(self, record: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / BRANCH_FILE, json.dumps(record, indent=1) + "\n")

    def write_config(self, config: dict, own_tokenizer: bool = True) -> None:
        """config.yaml: the resolved config, its tokenizer path pointing at the run's own tokenizer.json (a run
        without one, `own_tokenizer=False`: an import of weights alone, keeps `config` as it is)."""
        import yaml

        config = json.loads(json.dumps(config))  # a deep copy of plain containers
        if own_tokenizer:
            config.setdefault("data", {}).setdefault("tokenizer", {})["path"] = str(self.dir / TOKENIZER_FILE)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))

    def write_tokenizer(self, text: str) -> None:
        """tokenizer.json (its JSON text), atomically: the run decodes without the cache it came from."""
        path = self.dir / TOKENIZER_FILE
        self.dir.mkdir(parents=True, exist_ok=True)
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
        print(
            f"[diffllm.train] {why}: moved the previous run's {', '.join(p.name for p in present)} to {dest}",
            flush=True,
        )
        return dest

    def check_writable(self) -> None:
        """Before anything is written: run_dir and its checkpoints folder, where they exist, must be writable, and a
        new run_dir's nearest existing parent too (os.access: the process's own permissions, root's included)."""
        for path in (self.dir, self.checkpoints_dir):
            if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
                raise UserError(f"run_dir={self.dir}: {path} is not writable (permission denied); use another run_dir")
        parent = self.dir
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if parent != self.dir and not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"run_dir={self.dir}: cannot create it ({parent} is not writable: permission denied)")

    def prepare(self) -> None:
        """Rank 0, once a launch's inputs (config, checkpoint, data) are checked: create the directory and delete
        interrupted saves. Nothing creates the directory before that, so bad input leaves no empty run_dir behind."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"run_dir={self.dir}: cannot create it ({e.strerror})") from None
        self.remove_partial()

    def append_metrics(self, rec: dict) -> None:
        """One record appended to metrics.jsonl (rank 0); a kill mid-line is tolerated by `parse_metrics`; a full disk
        is one line naming the file and the free space."""
        try:
            with open(self.dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            if e.errno in NO_SPACE:
                raise no_space(self.dir / METRICS_FILE, e.strerror) from None
            raise

    def truncate_metrics(self, step: int) -> int:
        """On resume: drop the records of steps after the checkpoint (they are recomputed). Returns how many."""
        path = self.dir / METRICS_FILE
        if not path.exists():
            return 0
        text = path.read_text()
        records = parse_metrics(text, path)  # a last line cut short by a kill is left out, and dropped here
        keep = [rec for rec in records if rec["step"] <= step]
        if len(keep) != len(records) or (text and not text.endswith("\n")):
            self.write_metrics(keep)
        return len(records) - len(keep)

    def write_metrics(self, records: list[dict]) -> None:
        """metrics.jsonl made of `records` (atomically): a truncation, or a branch's start from its parent's."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / METRICS_FILE, "".join(json.dumps(rec) + "\n" for rec in records))

    def config(self) -> Optional[dict]:
        """The run's resolved config (config.yaml), or None for a run directory without one (nothing written yet)."""
        from omegaconf import OmegaConf

        path = self.dir / CONFIG_FILE
        if not path.is_file():
            return None
        try:
            return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as e:  # noqa: BLE001 - any parse failure means a damaged file
            raise UserError(f"{path}: not a readable YAML config ({type(e).__name__}); the file is damaged") from None

    # ----- checkpoints ---------------------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Published checkpoints' steps, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(
            int(m.group(1)) for p in self.checkpoints_dir.iterdir() if p.is_dir() and (m := TAG.match(p.name))
        )

    def latest(self) -> Optional[Checkpoint]:
        return find_checkpoint(self.checkpoints_dir) if self.checkpoints_dir.is_dir() else None

    def checkpoint(self, step: Union[int, str] = "latest") -> Checkpoint:
        """The checkpoint at `step` ("latest", or an int), or a one-line ValueError saying what there is."""
        if self.pinned is not None and step == "latest":
            return self.pinned
        if step == "latest":
            found = self.latest()
            if found is None:
                raise UserError(
                    f"{self.dir}: no checkpoints (train it first, or pass a run directory that has checkpoints/)"
                )
            return found
        try:
            step = int(step)
        except ValueError:
            raise UserError(f"step={step!r}: expected latest or a step number") from None
        if step not in self.steps():
            have = ", ".join(map(str, self.steps())) or "none"
            raise UserError(f"step={step}: {self.dir} has no checkpoint at that step (steps: {have})")
        return Checkpoint(self.checkpoints_dir, f"step{step}", read_meta(self.checkpoints_dir / f"step{step}"))

    def remove_partial(self) -> None:
        """Rank 0, at start-up: folders of saves that were interrupted (never published) are deleted."""
        for p in sorted(self.checkpoints_dir.glob("tmp-*")) if self.checkpoints_dir.is_dir() else []:
            print(f"checkpoint: removing {p} (a save that never completed)", flush=True)
            shutil.rmtree(p, ignore_errors=True)

    def publish(self, tmp: str, tag: str, meta: dict) -> Checkpoint:
        """Rank 0, once every rank has written `checkpoints/<tmp>`: add meta.json, rename it to `tag`, then replace
        `latest` atomically, so a save killed half-way leaves `latest` at the previous complete checkpoint."""
        write_atomic(self.checkpoints_dir / tmp / "meta.json", json.dumps(meta, indent=1) + "\n")
        if (self.checkpoints_dir / tag).exists():  # the same step saved again (e.g. a resumed run stopped at once)
            shutil.rmtree(self.checkpoints_dir / tag)
        os.rename(self.checkpoints_dir / tmp, self.checkpoints_dir / tag)
        write_atomic(self.checkpoints_dir / "latest", tag)
        return Checkpoint(self.checkpoints_dir, tag, meta)

    def write_weights(self, state_dict: dict, meta: dict) -> Checkpoint:
        """A checkpoint from plain weights (`diffllm import`): DeepSpeed's ZeRO-0 layout, which
        `consolidated_state_dict`
        reads back and `diffllm train` resumes or starts from."""
        import torch

        tag, tmp = f"step{meta['step']}", f"tmp-step{meta['step']}"
        (self.checkpoints_dir / tmp).mkdir(parents=True)
        torch.save(
            {"module": {k: v.contiguous() for k, v in state_dict.items()}}, self.checkpoints_dir / tmp / MODEL_STATES
        )
        return self.publish(tmp, tag, meta)

    def publish_universal(self, ckpt: Checkpoint, tmp: Path) -> str:
        """A universal conversion of `ckpt` written to `tmp` -> `<tag>_universal` and DeepSpeed's `latest_universal`."""
        out = f"{ckpt.tag}_universal"
        os.rename(tmp, ckpt.dir / out)
        write_atomic(ckpt.dir / "latest_universal", out)  # DeepSpeed's convention; it wrote the tmp name
        return out

    def prune(self, keep_last: int, keep: str, pinned: Collection[str] = ()) -> None:
        """Delete all but the newest `keep_last` checkpoints (and their universal conversions); never `keep`, and
        never a `pinned` tag (a WSD run's branch points), which does not count among the `keep_last`."""
        tags = [f"step{s}" for s in self.steps() if f"step{s}" not in pinned]
        for t in tags[: max(0, len(tags) - keep_last)]:
            if t != keep:
                shutil.rmtree(self.checkpoints_dir / t, ignore_errors=True)
                shutil.rmtree(self.checkpoints_dir / f"{t}_universal", ignore_errors=True)

    # ----- a trained model -----------------------------------------------------------------------------------------
    def tokenizer(self):
        """The tokenizer the run trained with (see `choose_tokenizer`); a damaged one is a one-line error."""
        path, _ = choose_tokenizer(self)
        if path is None:
            raise UserError(
                f"{self.dir}: no {TOKENIZER_FILE} in the run directory (a run keeps the tokenizer it "
                f"trained with; an import of weights alone has none)"
            )
        tok_cfg = ((self.config() or {}).get("data") or {}).get("tokenizer") or {}
        return read_tokenizer(path, tok_cfg.get("eos_token", "<|endoftext|>"))

    def model_config(self, step: Union[int, str] = "latest"):
        """The ModelConfig of the checkpoint at `step`, from its meta.json alone (no weights are read)."""
        from .model import ModelConfig

        ckpt = self.checkpoint(step)
        try:
            return ModelConfig(**ckpt.meta["model"])
        except TypeError as e:
            raise UserError(f"{ckpt.path / 'meta.json'}: its model config does not fit this diffllm ({e})") from None

    def fp32_weights(self, ckpt: Checkpoint) -> dict:
        """`consolidated_state_dict(ckpt)`, gathered once per checkpoint: a ZeRO 1-3 checkpoint's fp32 weights are
        kept in eval/fp32-<tag>.pt (the latest checkpoint read only), beside the identity of the checkpoint they came
        from (its tag and each file's size and mtime), so every later eval, generate or export reads them back at
        once, and a checkpoint saved again under the same tag is gathered again. ZeRO-0 checkpoints hold whole
        weights: they are read directly. A run directory that cannot be written to keeps no cache."""
        if ckpt.zero_stage == 0:
            return consolidated_state_dict(ckpt)
        import torch

        cache, identity = self.dir / "eval" / f"fp32-{ckpt.tag}.pt", checkpoint_identity(ckpt)
        try:
            saved = torch.load(cache, map_location="cpu", weights_only=True, mmap=True)
            if saved.get("identity") == identity:
                return saved["state_dict"]
        except Exception:  # noqa: BLE001 - none yet, or one cut short: gathered again
            pass
        state = consolidated_state_dict(ckpt)
        tmp = cache.with_name(f".{cache.name}.tmp{os.getpid()}")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"identity": identity, "state_dict": state}, tmp)  # written aside, then renamed
            os.replace(tmp, cache)
        except OSError:  # a read-only run directory, a full disk: no cache
            tmp.unlink(missing_ok=True)
            return state
        for old in cache.parent.glob("fp32-step*.pt"):  # one cache per run: its size is the model's in fp32
            if old != cache:
                old.unlink(missing_ok=True)
        print(f"[diffllm] cached the fp32 weights of {ckpt.tag} in {cache}", file=sys.stderr, flush=True)
        return state

    def model(self, step: Union[int, str] = "latest", device: str = "cpu", tokenizer: bool = True):
        """(ModelConfig, DecoderLM in eval mode with the checkpoint's fp32 weights, Tokenizer or None)."""
        from .model import DecoderLM

        ckpt = self.checkpoint(step)
        cfg = self.model_config(step)
        tok = self.tokenizer() if tokenizer else None  # a damaged tokenizer.json before the weights are gathered
        model = DecoderLM(cfg)
        missing, unexpected = model.load_state_dict(self.fp32_weights(ckpt), strict=False)
        if missing or unexpected:
            raise UserError(
                f"{ckpt.path}: weights do not fit {cfg.name} ({cfg.arch}): missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )
        return cfg, model.to(device).eval(), tok


def read_tokenizer(path: Path, eos_token: str):
    """The Tokenizer of a model's tokenizer.json (or HF tokenizer folder); a damaged one is a one-line UserError
    naming it (the tokenizers library raises a bare Exception: "EOF while parsing a string at line 1 column 3000")."""
    from .data import load_tokenizer

    try:
        return load_tokenizer(str(path), eos_token)
    except UserError:  # the data layer's own one line, naming the file
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file, whatever the library raises for it
        raise UserError(f"{path}: cannot load this tokenizer ({exception_line(e)}); the file is damaged") from None


def model_tokenizer(path: Union[str, Path]) -> Optional[Path]:
    """The tokenizer that comes with a model directory (a diffllm run, or a Hugging Face folder): its tokenizer.json,
    or the folder itself when it holds only an HF tokenizer_config.json; None without one."""
    folder = Run(path).dir
    if (folder / TOKENIZER_FILE).is_file():
        return folder / TOKENIZER_FILE
    return folder if (folder / "tokenizer_config.json").is_file() else None


def choose_tokenizer(
    run: Run,
    resume: Optional[Checkpoint] = None,
    configured: Optional[str] = None,
    init_from: Optional[Union[str, Path]] = None,
    fresh: bool = False,
) -> tuple[Optional[Path], bool]:
    """Which tokenizer `run` uses -> (path or None, kept): the one decision, for training, import and reading back.

    1. kept (True): a run directory that holds its tokenizer.json keeps it (a trained, imported or resumed run; a
       fresh start's old one does not count: `fresh`), and a new run from another run's checkpoint `resume`
       keeps that run's: data.tokenizer may not change it;
    2. data.tokenizer.path (`configured`), when set;
    3. a new run from model.init_from: that model's tokenizer (`model_tokenizer`);
    4. None: the configured default (the byte-level BPE trained on the sources, cached).
    `fresh`: the launch starts afresh in `run` (its old files are to be moved aside): its own tokenizer.json does not
    count."""
    owners = ([] if fresh else [run.dir]) + ([resume.dir.parent] if resume is not None else [])
    return tokenizer_choice(
        [owner / TOKENIZER_FILE for owner in owners if (owner / TOKENIZER_FILE).is_file()],
        configured,
        lambda: model_tokenizer(init_from) if init_from and resume is None else None,
    )


def tokenizer_choice(
    kept: list[Path], configured: Optional[str], from_init: Callable[[], Optional[Path]]
) -> tuple[Optional[Path], bool]:
    """`choose_tokenizer`'s decision over what it found (the resume plan makes it over its snapshot of the run):
    `kept`, the tokenizer.json of each run whose tokenizer is kept, in order; data.tokenizer.path (`configured`);
    `from_init`, model.init_from's tokenizer (asked only when nothing before it decides)."""
    if kept:
        return kept[0], True
    if configured:
        return Path(configured), False
    return from_init(), False


def checkpoint_identity(ckpt: Checkpoint) -> dict:
    """What a checkpoint's weights depend on: its tag and each of its files' name, size and mtime."""
    files = sorted(p for p in ckpt.path.iterdir() if p.is_file())
    return {"tag": ckpt.tag, "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def consolidated_state_dict(ckpt: Checkpoint) -> dict:
    """fp32 weights of a checkpoint of any ZeRO stage and world size: ZeRO-0 keeps whole weights in its model-states
    file; ZeRO 1-3 are gathered from their fp32 optimizer shards by DeepSpeed's zero_to_fp32. Every file is read
    weights-only (runfiles.load_states, runfiles.weights_only): a pickle that would run code is refused in one line."""
    states = ckpt.path / MODEL_STATES  # ZeRO-3 names it zero_pp_rank_<r>_mp_rank_00_model_states.pt, one per rank
    if not (states.is_file() or any(ckpt.path.glob(f"*_{MODEL_STATES}"))):
        raise UserError(f"{ckpt.path}: no {MODEL_STATES} (an incomplete or foreign checkpoint)")
    ckpt.check_pickles()  # names the file; zero_to_fp32 below reads weights-only anyway
    try:
        if ckpt.zero_stage == 0:
            module = load_states(states)["module"]
            return {k: v.float() for k, v in module.items()}
        # DeepSpeed's import logs ("Setting accelerator to CPU") and its progress lines go to stderr: stdout is the
        # caller's (generate's text, export's summary)
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            with weights_only():
                return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt.dir), tag=ckpt.tag))
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - torch/DeepSpeed raise many types for a damaged file
        if (refusal := refused(ckpt.path, e)) is not None:
            raise refusal from None
        raise UserError(
            f"{ckpt.path}: cannot read its weights ({exception_line(e)}); the checkpoint is damaged: use "
            f"an earlier step"
        ) from None
