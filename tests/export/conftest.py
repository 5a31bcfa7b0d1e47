"""Export-test fixtures: one tiny trained run per layout (trained concurrently, once per session), on the trainer
tests' offline session environment and tokenizer (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import train_side_by_side
from tests.export.helpers import LAYOUTS, SESSION, TRAIN


@pytest.fixture(scope="session")
def runs(tokenizer) -> dict[str, Path]:
    """layout -> a finished run directory (with the session tokenizer as its tokenizer.json)."""
    train_side_by_side(
        {name: [*over, *TRAIN, f"run_dir={SESSION / 'runs' / name}"] for name, (over, _) in LAYOUTS.items()},
        SESSION / "logs",
    )
    # self-contained: the trainer wrote its tokenizer.json and config.yaml
    return {name: SESSION / "runs" / name for name in LAYOUTS}
