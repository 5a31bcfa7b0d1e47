"""`diffllm launch --procs 2` for real on CPU, as issue 56 found it: kill -9 of `diffllm launch` or of its torchrun
left torchrun and both ranks training (re-parented to init), and the same command run again started a second job on
the run directory; a refusal that only the ranks can see (a 2-rank ZeRO-0 run resumed on 4 ranks) was said 4 times and
then buried under torchrun's ~40-line ChildFailedError, exit 1; SIGTERM exited 3 after the save but after torchrun's
28-line SignalException. The runs are held where the test needs them by faults (a stall at a chosen step), not by
waiting; leftovers are found by process (a marker in every process's environment), not by log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from diffllm.runs import read_metrics
from tests.distributed import REPO, base_env
from tests.train.helpers import TINY
from tests.train.test_orphans import marked

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")]
ARGS = [a for a in TINY if not a.startswith(("trainer.tokens=", "trainer.save_every_steps="))] + [
    "trainer.tokens=4096",  # 4 steps of 1024 tokens
    "trainer.save_every_steps=2",
    "data.num_workers=1",  # a DataLoader forkserver and worker below each rank: they must go too
]


def launch(run_dir: Path, *extra: str, procs: int = 2, marker: str = "", log: Path) -> subprocess.Popen:
    """`diffllm launch --procs <procs>`, its stdout and stderr in files (a pipe would stay open while a leftover
    holds it)."""
    cmd = [sys.executable, "-m", "diffllm.cli", "launch", "--procs", str(procs), *ARGS, f"run_dir={run_dir}", *extra]
    env = base_env({"DIFFLLM_TEST_MARKER": marker} if marker else {})
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)


def said(log: Path) -> tuple[str, str]:
    return log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, log: Path, timeout: float = 300) -> None:
    """Until the job has published its step-2 checkpoint."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / "latest").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, said(log)
        time.sleep(0.1)


def files(run_dir: Path) -> dict:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("killed", ["diffllm launch", "torchrun"])
def test_kill_9_of_the_launcher_leaves_no_rank_and_the_same_command_continues_the_run(tokenizer, tmp_path, killed):
    run_dir, marker, log = tmp_path / "run", f"diffllm-launch-test-{uuid.uuid4().hex}", tmp_path / "first"
    job = launch(run_dir, "trainer.faults.stall_at_steps=[3]", "trainer.stall_timeout_s=0", marker=marker, log=log)
    try:
        wait_for_checkpoint(job, run_dir, log)  # rank 0 then stalls at step 3, forever: mid-run when killed
        procs = {int(p.split()[0]): p.split(") ", 1)[1] for p in marked(marker)}  # pid: command line
        torchrun = [pid for pid, cmd in procs.items() if cmd.split()[1].endswith("/torchrun")]
        ranks = [pid for pid, cmd in procs.items() if " -m diffllm.train " in cmd]
        assert len(torchrun) == 1 and len(ranks) == 2, procs
        if killed == "diffllm launch":  # a second job on the busy run directory: refused, writing nothing
            before = files(run_dir)
            second = launch(run_dir, procs=1, log=tmp_path / "second")
            assert second.wait(300) == 2, said(tmp_path / "second")
            lines = [line for line in said(tmp_path / "second")[1].splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith(f"diffllm train: error: run_dir={run_dir} is in use by"), (
                lines
            )
            assert f", pid {ranks[0]}, since " in lines[0] or f", pid {ranks[1]}, since " in lines[0], (lines, procs)
            assert files(run_dir) == before
        os.kill(job.pid if killed == "diffllm launch" else torchrun[0], signal.SIGKILL)
        deadline = time.monotonic() + 60  # SIGKILLs in flight on a loaded machine: moments; before the fix, forever
        while (left := marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, "processes left behind:\n" + "\n".join(left)
        if killed == "torchrun":  # `diffllm launch` says what happened in one line, with the code a shell gives it
            assert job.wait(60) == 128 + signal.SIGKILL, said(log)
            assert said(log)[1].strip().endswith("diffllm launch: torchrun was killed by SIGKILL"), said(log)
            return
    finally:
        for line in marked(marker):  # whatever the test found, nothing of it outlives the test
            os.kill(int(line.split()[0]), signal.SIGKILL)
        job.kill()
        job.wait()
    # the docs' advice after a preemption: run the same command again. The killed job's lock names a process that has
    # ended: taken over at once; the run continues from step 2 and ends with every step once
    again = launch(run_dir, log=tmp_path / "again")
    assert again.wait(400) == 0, said(tmp_path / "again")
    out, err = said(tmp_path / "again")
    assert "lock.json: taking over the lock of host " in out and "its process has ended" in out, out
    assert "resumed from checkpoint" in out and "step2" in out, out
    steps = [r["step"] for r in read_metrics(run_dir) if "loss" in r]
    assert steps == [1, 2, 3, 4], steps
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert not (run_dir / "lock.json").exists()


def test_what_the_ranks_say_is_said_once_with_their_exit_code(tokenizer, tmp_path):
    """SIGTERM: the workers save and exit 3, and `diffllm launch` says so without torchrun's SignalException; a 2-rank
    ZeRO-0 run resumed on 4 ranks: every rank refuses, and the launcher shows the refusal once and exits 2, as
    `diffllm launch --help` promises for bad input."""
    run_dir, log = tmp_path / "run", tmp_path / "first"
    job = launch(run_dir, "trainer.zero_stage=0", "trainer.faults.step_delay_s=0.5", log=log)  # a slow node
    try:
        wait_for_checkpoint(job, run_dir, log)
        job.send_signal(signal.SIGTERM)
        assert job.wait(300) == 3, said(log)
    finally:
        job.kill()
    out, err = said(log)
    assert "Traceback" not in err and "SignalException" not in err, err
    assert "diffllm launch: stopped by SIGTERM" in err and "[diffllm.train] checkpoint: saved" in out, out + err
    four = launch(run_dir, "trainer.zero_stage=0", procs=4, log=tmp_path / "four")
    assert four.wait(400) == 2, said(tmp_path / "four")
    out, err = said(tmp_path / "four")
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("diffllm train: error: trainer.zero_stage: ") and "on 2 rank(s)" in lines[0], err
