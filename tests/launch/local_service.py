"""Throwaway services the launch tests start on this machine with a script of ours (tests/launch/<name>.sh up|down DIR,
all state under DIR), and the session fixture's life cycle: skip with the reason, start, always stop and clean up."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]


class LocalService:
    script: Path  # tests/launch/<name>.sh
    what: str  # for messages

    def __init__(self, state_dir: Path):
        self.dir = state_dir

    def up(self) -> None:
        out = subprocess.run(
            ["bash", str(self.script), "up", str(self.dir)], capture_output=True, text=True, timeout=120
        )
        if out.returncode != 0:
            self.down()
            raise RuntimeError(f"{self.what} did not start:\n{out.stdout}{out.stderr}")

    def down(self) -> None:
        subprocess.run(["bash", str(self.script), "down", str(self.dir)], capture_output=True, timeout=120)


S = TypeVar("S", bound=LocalService)


def session(make: Callable[[Path], S], unavailable: Callable[[], Optional[str]], prefix: str) -> Iterator[S]:
    """For a session fixture: `yield from session(Cluster, unavailable, "diffllm-slurm-")`."""
    why = unavailable()
    if why:
        pytest.skip(f"{make.what}: {why}")
    service = make(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        service.up()
        yield service
    finally:
        service.down()
        shutil.rmtree(service.dir, ignore_errors=True)
