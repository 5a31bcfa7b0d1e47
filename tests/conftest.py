"""Fixtures shared by every test folder that trains real runs: the offline session environment (a session folder for
caches, no Hub, no W&B; never the user's) and the 1024-token BPE of the tiny runs, trained once per session."""

from __future__ import annotations

import shutil

import pytest

import diffllm.cli.registry  # noqa: F401 - declares every command's typed configs: compose(name) finds them
from tests.train.helpers import ENV, SESSION


@pytest.fixture(scope="session", autouse=True)
def _env():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        yield
    shutil.rmtree(SESSION, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer(_env):
    """Trained in this process before any run needs it (the runs then find it in the session cache)."""
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, ensure_tokenizer

    cfg = compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"])
    return ensure_tokenizer(build(DataConfig, cfg.data, "data"))
