"""Launch-test fixtures, each started on first use and always torn down: one real SLURM cluster per test session, and
two ssh hosts (node-a, node-b) for DeepSpeed's pdsh launcher."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.launch import ssh_hosts as ssh
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


@pytest.fixture(scope="session")
def ssh_hosts():
    why = ssh.unavailable()
    if why:
        pytest.skip(f"local ssh hosts: {why}")
    hosts = ssh.SshHosts(Path(tempfile.mkdtemp(prefix="diffllm-ssh-")))
    try:
        hosts.up()
        yield hosts
    finally:
        hosts.down()
        shutil.rmtree(hosts.dir, ignore_errors=True)
