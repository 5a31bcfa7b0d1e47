"""Trainer-test fixtures: the uninterrupted 2-rank reference runs (one per ZeRO stage) that the resume tests compare
against bit for bit (the session environment and tokenizer are tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_train
from tests.train.helpers import SESSION, tiny


@pytest.fixture(scope="session")
def reference(tokenizer):
    """reference(stage) -> run_dir of an uninterrupted 2-rank run (made on first use, then shared)."""
    made: dict[int, Path] = {}

    def get(stage: int) -> Path:
        if stage not in made:
            run_dir = SESSION / f"ref-zero{stage}"
            run_train(
                tiny(run_dir, stage, workers=True),
                2,
                SESSION / f"ref-zero{stage}-logs",
                launcher="torchrun" if stage == 1 else "procs",
            )
            made[stage] = run_dir
        return made[stage]

    return get
