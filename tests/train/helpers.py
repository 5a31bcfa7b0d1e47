"""Shared by the trainer tests: the session folder, the tiny run config, and what must match between runs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

SESSION = Path(tempfile.mkdtemp(prefix="diffllm-train-tests-"))
# Set for every trainer test (and the processes it starts) by the session fixture in conftest.py.
ENV = {
    "HF_HOME": str(SESSION / "hf"),
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "DIFFLLM_CACHE": str(SESSION / "cache"),
}

STEPS = 16  # of 1024 tokens: micro-batch 4 x seq 64 x grad-accum 2 x 2 ranks
# The real shakespeare data config and the diff-tiny preset, shrunk: d_model 64, 2 layers, seq 64, BPE vocab 1024.
TINY = [
    "model.d_model=64",
    "model.n_layers=2",
    "data.seq_len=64",
    "data.tokenizer.vocab_size=1024",
    "trainer.micro_batch_size=4",
    "trainer.global_batch_tokens=1024",
    f"trainer.tokens={STEPS * 1024}",
    "trainer.log_every=1",
    "trainer.val_batches=4",
    "trainer.val_tokens=4096",  # the held-out set: 4096 tokens (64 windows) of the held-out plays, for speed
    "trainer.save_every_steps=4",
    "trainer.keep_last=3",
    "optim.warmup_steps=4",
    "optim.lr=3e-3",
    "optim.min_lr=3e-4",
    "data.num_workers=0",  # the in-process loader, except where WORKERS is asked for
]
# DataLoader workers (shakespeare.yaml's default: 1) for the tests about processes and resume across them: kills,
# stalls, launchers, the reference runs. Elsewhere the in-process loader yields the same batches bit for bit and
# saves a launch its forkserver (a second interpreter importing torch) and the first batch's wait on it: measured
# 1.0-1.5 s of a 16-step run's 8-10 s.
WORKERS = ["data.num_workers=1"]
REF_EXTRA = {0: [], 1: [], 2: [], 3: ["trainer.activation_checkpointing=true"]}  # ZeRO-3 also exercises recomputation


def tiny(run_dir: Path, stage: int, *extra: str, workers: bool = False) -> list[str]:
    workers_on = WORKERS if workers else []
    return TINY + [f"run_dir={run_dir}", f"trainer.zero_stage={stage}", *REF_EXTRA[stage], *workers_on, *extra]


def comparable(records: list[dict]) -> list[tuple]:
    """What must match bit for bit between runs: everything but timings."""
    keys = ("step", "tokens", "loss", "lr", "grad_norm", "val_loss", "skipped")
    return [tuple(r.get(k) for k in keys) for r in records]


def resumes_exactly_after_sigterm(args, tmp_path: Path, stop_at: int, steps: int, env: dict | None = None) -> Path:
    """The exact-resume check of a one-rank run (`args(run_dir)` -> its overrides): a run stopped by SIGTERM once it
    has logged step `stop_at` (exit 3, before its last step) and relaunched to its end logs the same numbers, bit for
    bit, as an uninterrupted reference. The reference trains beside the stopped run (one thread each: the two cores
    of this machine), not before it. Returns the reference's run directory."""
    import signal

    from diffllm.runs import read_metrics
    from tests.distributed import launch_train, run_train

    ref, run_dir = tmp_path / "ref", tmp_path / "run"
    reference = launch_train(args(ref), 1, tmp_path / "logs-ref", env=env, launcher="plain")
    run = launch_train(args(run_dir), 1, tmp_path / "logs1", env=env, launcher="plain")
    run.wait_until(lambda: any(m.get("step", 0) >= stop_at for m in read_metrics(run_dir)), timeout=240)
    run.send(signal.SIGTERM)
    assert run.wait(120) == [3], run.output(0)
    assert reference.wait(600) == [0], reference.output(0)
    assert max(m["step"] for m in read_metrics(run_dir)) < steps
    run_train(args(run_dir), 1, tmp_path / "logs2", env=env, launcher="plain")
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(ref))
    assert read_metrics(run_dir)[-1]["step"] == steps
    return ref


def make_view(run_dir: Path, steps: int, rank: int = 0, model=None, budget=None, world_size: int = 1, **asks):
    """A hook's View of a one-rank run of `steps` steps of 1024 tokens in `run_dir` (or of `budget` on `world_size`
    ranks), at step 0 (a fresh TrainState); `asks`: the View's callables (log, request_save, say, elapsed, failing)
    where a test wants its own."""
    from diffllm.budget import Branching, Budget
    from diffllm.runs import Run
    from diffllm.train.checkpoints.state import TrainState
    from diffllm.train.context import LaunchContext
    from diffllm.train.hooks import View

    budget = budget or Budget(steps * 1024, 1024, 4, 64, 1, 4, steps)
    say = asks.pop("say", lambda msg, error=False: None)
    ctx = LaunchContext(rank, world_size, torch.device("cpu"), budget, Branching({}), Run(run_dir), say)
    defaults = dict(log=lambda record: None, request_save=lambda agree=False: None)
    return View(ctx, TrainState(wandb_id="x"), model=lambda: model, **{**defaults, **asks})


@contextlib.contextmanager
def unwritable(path: Path):
    """`path` (a folder) made unwritable for this process and its children: chmod for a user; root ignores file
    modes, so for root the folder is made immutable (chattr +i), which binds root too."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        undo = lambda: path.chmod(0o755)  # noqa: E731
    else:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"as root, only chattr +i makes a folder unwritable, and it failed: {done.stderr.strip()}")
        undo = lambda: subprocess.run(["chattr", "-i", str(path)], check=True)  # noqa: E731
    try:
        assert not os.access(path, os.W_OK)
        yield path
    finally:
        undo()
