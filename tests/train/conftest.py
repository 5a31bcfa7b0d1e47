"""Trainer-test fixtures: a tokenizer trained once per session, and the uninterrupted 2-rank reference runs (one per
ZeRO stage) that the resume tests compare against bit for bit."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.distributed import run_train
from tests.train.helpers import ENV, SESSION, tiny


@pytest.fixture(scope="session", autouse=True)
def _env():
    """Offline, no W&B, and a session cache for the trained tokenizer: never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        yield
    shutil.rmtree(SESSION, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer(_env):
    """Train the 1024-token BPE once, in this process, before any run needs it."""
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, ensure_tokenizer

    cfg = compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"])
    return ensure_tokenizer(build(DataConfig, cfg.data, "data"))


@pytest.fixture(scope="session")
def reference(tokenizer):
    """reference(stage) -> run_dir of an uninterrupted 2-rank run (made on first use, then shared)."""
    made: dict[int, Path] = {}

    def get(stage: int) -> Path:
        if stage not in made:
            run_dir = SESSION / f"ref-zero{stage}"
            run_train(tiny(run_dir, stage), 2, SESSION / f"ref-zero{stage}-logs",
                      launcher="torchrun" if stage == 1 else "procs")
            made[stage] = run_dir
        return made[stage]

    return get

