"""The run directory as a launch finds it (`RunSnapshot`), read once before the resume plan (plan.py) decides from it
without going back to the disk: run_dir's files (config.yaml, summary.json, branch.json, its checkpoints' meta.json,
tokenizer.json), the checkpoint that trainer.resume=<path> names, a WSD branch's parent (trainer.branch_from: its
config and checkpoints) and model.init_from's tokenizer.

A file that cannot be read (a damaged config.yaml, a `latest` that points nowhere) is kept as its one-line error and
raised only where the plan reads it (`got`): a fresh start never reads run_dir's old files, so their damage does not
stop it, and every error comes in the order the plan meets it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar, Union

from ...errors import UserError
from ...runs import TOKENIZER_FILE, Checkpoint, Run, find_checkpoint, model_tokenizer

T = TypeVar("T")
Read = Union[T, UserError]  # what a file held, or the one-line error reading it raised


def attempt(read: Callable[[], T]) -> Read[T]:
    try:
        return read()
    except UserError as e:
        return e


def got(value: Read[T]) -> T:
    """What was read, or its error, raised where the plan first needs it."""
    if isinstance(value, UserError):
        raise value
    return value


def owned_tokenizer(folder: Path) -> Optional[Path]:
    """The run's own tokenizer.json in `folder`, if there."""
    return folder / TOKENIZER_FILE if (folder / TOKENIZER_FILE).is_file() else None


@dataclass(frozen=True)
class RunFiles:
    """One run directory as read at the start: run_dir, or a branch's parent."""

    dir: Path  # as given
    resolved: Path
    checkpoints_dir: Path
    is_dir: bool
    files: tuple[str, ...]  # the run's files present (runs.RUN_FILES): empty for a new or emptied run_dir
    config: Read[Optional[dict]]  # config.yaml (None: not there)
    finished: Read[bool]  # summary.json says the run finished
    branch: Read[Optional[dict]]  # branch.json (None: no branch)
    latest: Read[Optional[Checkpoint]]  # the checkpoint `latest` names (None: no checkpoint)
    checkpoints: dict[int, Read[Checkpoint]]  # every published checkpoint by step
    tokenizer: Optional[Path]  # its own tokenizer.json

    @classmethod
    def read(cls, run: Run) -> RunFiles:
        return cls(
            run.dir,
            run.dir.resolve(),
            run.checkpoints_dir,
            run.dir.is_dir(),
            tuple(p.name for p in run.files()),
            attempt(run.config),
            attempt(run.is_finished),
            attempt(run.branch),
            attempt(run.latest),
            {step: attempt(lambda step=step: run.checkpoint(step)) for step in run.steps()},
            owned_tokenizer(run.dir),
        )


@dataclass(frozen=True)
class CheckpointAt:
    """The checkpoint that trainer.resume=<path> names."""

    exists: bool  # the path exists
    checkpoint: Read[Optional[Checkpoint]]  # its checkpoint (None: no `latest` file or meta.json there)
    in_run_dir: bool  # it is one of run_dir's own checkpoints


@dataclass(frozen=True)
class RunSnapshot:
    """What the resume plan reads, read once at the start of a launch (`read`)."""

    run: RunFiles  # run_dir
    resume: Optional[CheckpointAt]  # trainer.resume=<path> (None: auto or none)
    parent: Optional[Read[RunFiles]]  # trainer.branch_from's run (None: no branch)
    init_tokenizer: Read[Optional[Path]]  # model.init_from's tokenizer (runs.model_tokenizer; None: none)
    tokenizers: dict[Path, Optional[Path]]  # a checkpoints folder read here -> its run's tokenizer.json (None: none)

    @classmethod
    def read(cls, run: Run, resume: str, branch_from: Optional[str], init_from: Optional[str]) -> RunSnapshot:
        """`run`: run_dir; `resume`, `branch_from`, `init_from`: trainer.resume, trainer.branch_from and
        model.init_from."""
        at = None
        if resume not in ("none", "auto") and Path(resume).exists():
            found = attempt(lambda: find_checkpoint(Path(resume)))
            ckpt = found if isinstance(found, Checkpoint) else None
            at = CheckpointAt(True, found, ckpt is not None and ckpt.dir.resolve() == run.checkpoints_dir.resolve())
        elif resume not in ("none", "auto"):
            at = CheckpointAt(False, None, False)
        own = RunFiles.read(run)
        parent = attempt(lambda: RunFiles.read(Run(branch_from))) if branch_from else None
        runs = [own, *([parent] if isinstance(parent, RunFiles) else [])]
        tokenizers = {r.checkpoints_dir: r.tokenizer for r in runs}
        if at is not None and isinstance(at.checkpoint, Checkpoint):
            tokenizers[at.checkpoint.dir] = owned_tokenizer(at.checkpoint.dir.parent)
        init_tokenizer = attempt(lambda: model_tokenizer(init_from)) if init_from else None
        return cls(own, at, parent, init_tokenizer, tokenizers)
