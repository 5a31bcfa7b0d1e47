"""Export-test fixtures: one tiny trained run per layout (trained concurrently, once per session), on the trainer
tests' offline session environment and tokenizer."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import launch_train
from tests.export.helpers import LAYOUTS, SESSION, TRAIN
from tests.train.conftest import _env, tokenizer  # noqa: F401 - the trainer tests' offline session and tokenizer


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
