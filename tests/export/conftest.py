"""Export-test fixtures: tiny trained runs, one per layout, each trained once per session when a test first asks for
it (the layouts asked for together train concurrently), on the trainer tests' offline session environment and
tokenizer (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import train_side_by_side
from tests.export.helpers import LAYOUTS, SESSION, TRAIN

FAST = ("stablelm", "diff-interleaved-gqa")  # the layouts the fast suite's export tests need (two runs, two cores)


@pytest.fixture(scope="session")
def layouts(tokenizer):
    """layouts(*names) -> {name: finished run directory}: the named layouts not yet trained this session are trained
    side by side, then shared (each with the session tokenizer as its tokenizer.json)."""
    done: dict[str, Path] = {}

    def get(*names: str) -> dict[str, Path]:
        todo = [n for n in names if n not in done]
        if todo:
            train_side_by_side(
                {n: [*LAYOUTS[n][0], *TRAIN, f"run_dir={SESSION / 'runs' / n}"] for n in todo}, SESSION / "logs"
            )
            done.update({n: SESSION / "runs" / n for n in todo})  # self-contained: its tokenizer.json, config.yaml
        return {n: done[n] for n in names}

    return get


@pytest.fixture(scope="session")
def runs(layouts) -> dict[str, Path]:
    """layout -> a finished run directory, for every layout (test-slow: the rest train beside FAST's)."""
    return layouts(*FAST, *(n for n in LAYOUTS if n not in FAST))


@pytest.fixture(scope="session")
def fast_runs(layouts) -> dict[str, Path]:
    """The two layouts of FAST only: what the fast suite trains for export (~10 s on 2 cores instead of every layout's
    ~50 s)."""
    return layouts(*FAST)
