"""Launch-test fixtures, each started on first use and always torn down: one real SLURM cluster per test session, and
two ssh hosts (node-a, node-b) for DeepSpeed's pdsh launcher."""

from __future__ import annotations

import pytest

from tests.launch import slurm_cluster
from tests.launch import ssh_hosts as ssh_hosts_module
from tests.launch.local_service import session


@pytest.fixture(scope="session")
def slurm():
    yield from session(slurm_cluster.Cluster, slurm_cluster.unavailable, "diffllm-slurm-")


@pytest.fixture(scope="session")
def ssh_hosts():
    yield from session(ssh_hosts_module.SshHosts, ssh_hosts_module.unavailable, "diffllm-ssh-")
