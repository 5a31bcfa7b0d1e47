"""DeepSpeed's runner over pdsh and ssh, for real: `diffllm launch --launcher deepspeed` with a two-entry hostfile
(node-a, node-b: two aliases of this machine's own sshd, tests/launch/conftest.py) starts one process per host; the
two ranks train to the same losses as a one-node torchrun run of 2 processes. The environment the ranks need, and
`--env`, reach them through the env file `diffllm launch` hands the runner (diffllm/launch/remote_env.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diffllm.runs import read_metrics
from tests.distributed import base_env, free_port
from tests.launch import ssh_hosts as ssh
from tests.train.helpers import ENV, comparable, tiny

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SHORT = ("model=ssh-probe", "trainer.tokens=8192")  # 8 steps


def launch(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "launch", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


def test_hostfile_of_two_hosts_over_pdsh_trains_like_torchrun(ssh_hosts, tmp_path):
    # A model preset only $DIFFLLM_CONFIG_PATH knows: the ranks that pdsh starts in a bare ssh shell find it only if
    # the launcher's environment reached them.
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "ssh-probe.yaml").write_text(
        "defaults:\n  - diff-tiny@_here_\n  - _self_\nname: ssh-probe\n"
    )
    env = {**base_env(), **ENV, "PATH": ssh_hosts.env["PATH"], "DIFFLLM_CONFIG_PATH": str(tmp_path / "conf")}
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")

    # --env reaches the ranks too: each run trains its tokenizer into its own cache folder, found nowhere else
    ds = launch(
        env,
        "--launcher",
        "deepspeed",
        "--hostfile",
        str(hostfile),
        "--nodes",
        "2",
        "--procs",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--env",
        f"DIFFLLM_CACHE={tmp_path / 'cache-ds'}",
        *tiny(tmp_path / "ds", 2, *SHORT, workers=True),
    )
    out = ds.stdout + ds.stderr
    assert ds.returncode == 0, out[-4000:]
    assert f"--hostfile {hostfile} --launcher pdsh --num_nodes 2 --num_gpus 1" in ds.stdout.splitlines()[0]
    assert "pdsh -S -f 1024 -w node-a,node-b" in out  # the runner's own log of the command it ran
    assert "node-a: " in out and "node-b: " in out and "node_rank=1" in out  # one launcher per host, through pdsh
    summary = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert (summary["status"], summary["world_size"]) == ("finished", 2)
    env_file = re.search(r"deepspeed_env file = (\S+)", out).group(1)  # the runner read ours, and it is gone now
    assert Path(env_file).name.startswith("diffllm-deepspeed-env-") and not Path(env_file).exists()

    ref = launch(
        env,
        "--procs",
        "2",
        "--master-port",
        str(free_port()),
        "--env",
        f"DIFFLLM_CACHE={tmp_path / 'cache-ref'}",
        *tiny(tmp_path / "ref", 2, *SHORT, workers=True),
    )
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-4000:]
    for cache in ("cache-ds", "cache-ref"):
        assert len(list((tmp_path / cache).glob("tokenizers/*/tokenizer.json"))) == 1, cache
    ours, theirs = read_metrics(tmp_path / "ds"), read_metrics(tmp_path / "ref")
    assert [m["step"] for m in ours if "loss" in m] == list(range(1, 9))
    assert comparable(ours) == comparable(theirs)  # same ranks, same data: bit-equal on CPU fp32


def test_the_host_that_does_not_answer_is_named(ssh_hosts, tmp_path):
    """Every host is tried before the runner starts (DeepSpeed's own check tries only the first): one line."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=1\nno-such-host.invalid slots=1\n")
    out = launch(
        {**base_env(), **ENV, "PATH": ssh_hosts.env["PATH"]},
        "--launcher",
        "deepspeed",
        "--hostfile",
        str(hostfile),
        "--nodes",
        "2",
        "--procs",
        "1",
        "model=diff-tiny",
    )
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("diffllm launch: error: ")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith(
        f"diffllm launch: error: hostfile {hostfile}: host 'no-such-host.invalid' is not reachable over ssh ("
    )


def test_local_ssh_down_leaves_nothing(tmp_path):
    """tests/launch/local_ssh.sh up, then down: the sshd is gone, and so is every file it wrote."""
    why = ssh.unavailable()
    if why:
        pytest.skip(f"local ssh hosts: {why}")
    hosts = ssh.SshHosts(tmp_path / "state")
    hosts.up()
    pid = int((hosts.dir / "sshd.pid").read_text())
    assert (
        subprocess.run(
            ["ssh", "node-b", "echo", "hi"], capture_output=True, text=True, env=hosts.env, timeout=60
        ).stdout
        == "hi\n"
    )
    hosts.down()
    assert not hosts.dir.exists() and not Path(f"/proc/{pid}").exists()
