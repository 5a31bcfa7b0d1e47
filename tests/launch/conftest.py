"""Launch-test fixtures: one real SLURM cluster per test session (started on first use, always torn down)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.launch.slurm_cluster import Cluster, unavailable


@pytest.fixture(scope="session")
def slurm():
    why = unavailable()
    if why:
        pytest.skip(f"real SLURM: {why}")
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="diffllm-slurm-")))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(cluster.dir, ignore_errors=True)
