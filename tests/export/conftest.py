"""Export-test fixtures: one tiny trained run per layout (trained concurrently, once per session), on the trainer
tests' offline session environment and tokenizer (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import launch_train
from tests.export.helpers import LAYOUTS, SESSION, TRAIN


@pytest.fixture(scope="session")
def runs(tokenizer) -> dict[str, Path]:
    """layout -> a finished run directory (with the session tokenizer as its tokenizer.json)."""
    wanted = LAYOUTS
    launches = {
        name: launch_train(
            [*over, *TRAIN, f"run_dir={SESSION / 'runs' / name}"], 1, SESSION / "logs" / name, launcher="plain"
        )
        for name, (over, _) in wanted.items()
    }
    for name, launch in launches.items():
        codes = launch.wait(600)
        assert codes == [0], f"{name}: training failed:\n{launch.output(0)[-4000:]}"
    out = {}
    for name in wanted:
        out[name] = SESSION / "runs" / name  # self-contained: the trainer wrote its tokenizer.json and config.yaml
    return out
