"""Two nodes for real on one machine: two `diffllm launch --nodes 2 --node-rank 0/1` agents (one process each, c10d
rendezvous on 127.0.0.1) train and checkpoint; the run resumes on one node. Ctrl-C under `diffllm launch` waits for
the save and exits 3. Rendezvous and hostfile failures end in one line naming the node rank, port or host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffllm.runs import find_checkpoint, read_metrics
from tests.distributed import base_env, free_port
from tests.train.helpers import ENV, STEPS, tiny

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def launch(*args: str, log: Path) -> subprocess.Popen:
    """`diffllm launch ...` as a user starts it on a node; output to `log`."""
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "diffllm.cli", "launch", *args],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**base_env(), **ENV},
            start_new_session=True,
        )


def one_line_error(*args: str, timeout: float = 300) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "launch", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**base_env(), **ENV},
        timeout=timeout,
    )
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("diffllm launch: error: ")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return errors[0]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_two_nodes_train_checkpoint_then_resume_on_one(tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    train = tiny(run_dir, 2, workers=True)  # ZeRO-2: the 2 -> 1 resume goes through DeepSpeed's universal checkpoint
    nodes = [
        launch(
            "--nodes",
            "2",
            "--procs",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--node-rank",
            str(r),
            "--rdzv-timeout-s",
            "300",
            *train,
            log=tmp_path / f"node{r}.log",
        )
        for r in (1, 0)
    ]  # rank 1 first: it waits for the master
    try:
        codes = [p.wait(timeout=600) for p in nodes]
    finally:
        stop(nodes)
    logs = [(tmp_path / f"node{r}.log").read_text() for r in (1, 0)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "--nnodes 2 --nproc_per_node 1 --node_rank 0" in logs[1].splitlines()[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["world_size"]) == ("finished", 2)

    again = tmp_path / "again"  # the step-8 checkpoint continued on one node, one process
    shutil.copytree(run_dir / "checkpoints" / "step8", again / "checkpoints" / "step8")
    (again / "checkpoints" / "latest").write_text("step8")
    one = launch("--procs", "1", *tiny(again, 2, workers=True), log=tmp_path / "one.log")
    try:
        assert one.wait(timeout=600) == 0, (tmp_path / "one.log").read_text()[-3000:]
    finally:
        stop([one])
    assert "world size 2 -> 1" in (tmp_path / "one.log").read_text()
    ours = {m["step"]: m["loss"] for m in read_metrics(again) if "loss" in m}
    theirs = {m["step"]: m["loss"] for m in read_metrics(run_dir) if "loss" in m and m["step"] > 8}
    assert sorted(ours) == sorted(theirs) == list(range(9, STEPS + 1))
    for step, loss in theirs.items():  # the same data and weights; only the order of the gradient sums differs
        assert ours[step] == pytest.approx(loss, abs=2e-5), step
    assert json.loads((again / "summary.json").read_text())["world_size"] == 1


def test_ctrl_c_waits_for_the_save_and_exits_3(tmp_path):
    """SIGINT to `diffllm launch` (the terminal's Ctrl-C): torchrun passes it on, both workers finish the step and
    save, the launcher exits 3 with one line and no traceback of its own; `latest` is the stopped step."""
    run_dir = tmp_path / "run"
    proc = launch(
        "--procs",
        "2",
        *tiny(run_dir, 1, "trainer.tokens=409600", "trainer.save_every_steps=0", workers=True),
        log=tmp_path / "launch.log",
    )
    try:
        deadline = time.monotonic() + 300
        while not any(m.get("step", 0) >= 2 for m in _metrics(run_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "launch.log").read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        stop([proc])
    out = (tmp_path / "launch.log").read_text()
    assert code == 3, out[-3000:]
    assert "SIGINT received" in out and "diffllm launch: stopped by SIGINT" in out
    assert "KeyboardInterrupt" not in out
    stopped = max(m["step"] for m in read_metrics(run_dir))
    assert find_checkpoint(run_dir / "checkpoints").step == stopped < 400


def _metrics(run_dir: Path) -> list[dict]:
    try:
        return read_metrics(run_dir)
    except ValueError:  # a line being written
        return []


def test_a_node_that_never_joins_is_named(tmp_path):
    err = one_line_error(
        "--nodes",
        "4",
        "--procs",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--node-rank",
        "0",
        "--rdzv-timeout-s",
        "2",
        "trainer.micro_batch_size=4",
    )
    assert "timed out after 2 s: node rank(s) 1, 2, 3 never joined (1 of 4 nodes did" in err


def test_rendezvous_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = one_line_error(
            "--nodes",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--node-rank",
            "0",
            "--rdzv-timeout-s",
            "5",
        )
    assert err == (
        f"diffllm launch: error: rendezvous port {port} on 127.0.0.1 is already in use (another run, or a "
        f"leftover process?): pick a free one with --master-port"
    )


@pytest.mark.skipif(not shutil.which("ssh"), reason="no ssh client (apt-get install openssh-client)")
def test_unreachable_hostfile_host(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("no-such-host.invalid slots=1\n")
    err = one_line_error("--launcher", "deepspeed", "--hostfile", str(hosts), "--procs", "1", "model=diff-tiny")
    assert err.startswith(
        f"diffllm launch: error: hostfile {hosts}: host 'no-such-host.invalid' is not reachable over ssh ("
    )
