"""Export-test fixtures: the session tokenizer and one tiny trained run per layout (trained concurrently, once)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.distributed import launch_train
from tests.export.helpers import ENV, LAYOUTS, SESSION, TRAIN


@pytest.fixture(scope="session", autouse=True)
def _env():
    """Offline, no W&B, and session caches (tokenizer, HF modules): never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        yield
    shutil.rmtree(SESSION, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer(_env):
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, ensure_tokenizer

    cfg = compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"])
    return ensure_tokenizer(build(DataConfig, cfg.data, "data"))


def registered_archs() -> tuple[str, ...]:
    try:
        from diffllm.model.variant import variants

        return tuple(variants())
    except ImportError:
        from diffllm.model.config import ARCHS

        return tuple(ARCHS)


@pytest.fixture(scope="session")
def runs(tokenizer) -> dict[str, Path]:
    """layout -> a finished run directory (with the session tokenizer as its tokenizer.json)."""
    wanted = {k: v for k, v in LAYOUTS.items() if k != "diff2" or "diff2" in registered_archs()}
    launches = {name: launch_train([*over, *TRAIN, f"run_dir={SESSION / 'runs' / name}"], 1,
                                   SESSION / "logs" / name, launcher="plain") for name, (over, _) in wanted.items()}
    for name, launch in launches.items():
        codes = launch.wait(600)
        assert codes == [0], f"{name}: training failed:\n{launch.output(0)[-4000:]}"
    out = {}
    for name in wanted:
        run_dir = SESSION / "runs" / name
        if not (run_dir / "tokenizer.json").exists():
            tokenizer.save(run_dir / "tokenizer.json")
        out[name] = run_dir
    return out
