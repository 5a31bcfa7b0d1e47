"""diffllm/runlock.py: one job per run directory. Holders are real processes (a few lines of Python holding the lock
until told to go); what a process on another host would leave is written as it would write it, and a holder that
stopped touching its lock is made by setting the lock's mtime back: faults, not waits."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from diffllm import runlock
from diffllm.errors import UserError
from diffllm.runlock import LOCK_FILE, STALE_S, RunLock
from tests.distributed import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

HOLDER = """
import sys
from diffllm.errors import UserError
from diffllm.runlock import RunLock
try:
    lock = RunLock.take(sys.argv[1], say=lambda msg: None)
    print("held", flush=True)
except UserError as e:
    print("refused", e, flush=True)
    sys.exit(2)
sys.stdin.read()  # until the test closes our stdin
lock.release()
"""


def holder(run_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def written_by_another_host(run_dir, **changes) -> dict:
    """The lock a job on another machine would have written into run_dir (touched now)."""
    record = dict(runlock.me(run_dir), host="node-b", boot_id="b-boot", pid=4242, start="17", **changes)
    (run_dir / LOCK_FILE).write_text(json.dumps(record))
    return record


def untouched_for(run_dir, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(run_dir / LOCK_FILE, (t, t))


def test_a_second_job_is_refused_naming_the_holder_and_a_dead_ones_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    first = holder(run_dir)
    try:
        assert first.stdout.readline().strip() == "held"
        record = json.loads((run_dir / LOCK_FILE).read_text())
        assert (record["host"], record["pid"]) == (socket.gethostname(), first.pid)
        with pytest.raises(UserError) as refused:
            RunLock.take(run_dir)
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"run_dir={run_dir} is in use by another job (host ")
        assert f"host {socket.gethostname()}, pid {first.pid}, since {record['since_text']}" in line, line
        assert "lapses" not in line  # on this machine its process is looked at: no heartbeat to wait for
        with pytest.raises(UserError):
            RunLock.check_free(run_dir)  # a job that only reads the run (a finished one relaunched) is refused too
    finally:
        first.kill()  # SIGKILL: no release; the lock file stays behind
        first.wait()
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == first.pid
    said = []
    lock = RunLock.take(run_dir, say=said.append)
    try:
        assert said == [
            f"{run_dir / LOCK_FILE}: taking over the lock of {runlock.describe(record)}: its process has ended"
        ]
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not (run_dir / LOCK_FILE).exists() and run_dir.is_dir()  # the folder was there before: it stays


def test_of_jobs_starting_together_exactly_one_holds_the_lock(tmp_path):
    jobs = [holder(tmp_path / "run") for _ in range(4)]
    try:
        said = [j.stdout.readline().split()[0] for j in jobs]
        assert sorted(said) == ["held", "refused", "refused", "refused"], said
    finally:
        for j in jobs:
            j.kill()
            j.wait()


def test_a_lock_held_from_another_host_lapses_only_when_its_heartbeat_stops(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = written_by_another_host(run_dir)
    untouched_for(run_dir, STALE_S - 30)
    with pytest.raises(UserError) as refused:
        RunLock.take(run_dir)
    assert f"host node-b, pid 4242, since {record['since_text']}; its {LOCK_FILE} touched 90 s ago" in str(
        refused.value
    )
    assert f"its lock lapses {STALE_S:.0f} s after its last touch" in str(refused.value)
    untouched_for(run_dir, STALE_S + 30)
    said = []
    lock = RunLock.take(run_dir, say=said.append)
    lock.release()
    assert said == [
        f"{run_dir / LOCK_FILE}: taking over the lock of {runlock.describe(record)}: no heartbeat for 150 s (> 120 s)"
    ]


def test_a_slurm_requeue_of_the_same_job_takes_over_at_once(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    written_by_another_host(run_dir, slurm_job_id="77", slurm_restart_count=0)  # touched just now
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the same run of the job: another srun step, not a requeue
    with pytest.raises(UserError, match=r"\(SLURM job 77\)"):
        RunLock.take(run_dir)
    monkeypatch.setenv("SLURM_JOB_ID", "78")  # another job
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(UserError, match="in use by another job"):
        RunLock.take(run_dir)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    said = []
    lock = RunLock.take(run_dir, say=said.append)
    lock.release()
    assert said[0].endswith("this is a requeue of its SLURM job 77 (restart 1 > 0)"), said


def test_a_lock_copied_with_its_run_directory_does_not_count(tmp_path):
    first = holder(tmp_path / "run")
    try:
        assert first.stdout.readline().strip() == "held"
        copy = tmp_path / "copy"
        copy.mkdir()
        (copy / LOCK_FILE).write_bytes((tmp_path / "run" / LOCK_FILE).read_bytes())  # cp -r of a running run
        said = []
        RunLock.take(copy, say=said.append).release()
        assert said[0].endswith("its lock was copied from another run directory"), said
    finally:
        first.kill()
        first.wait()


def test_the_heartbeat_touches_the_lock_and_tells_when_another_job_took_it(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    lock = RunLock.take(run_dir)
    try:
        untouched_for(run_dir, 100)
        assert lock.beat() and time.time() - (run_dir / LOCK_FILE).stat().st_mtime < 50
        (run_dir / LOCK_FILE).unlink()  # deleted by hand while the job runs: put back
        assert lock.beat() and json.loads((run_dir / LOCK_FILE).read_text())["token"] == lock.record["token"]
        written_by_another_host(run_dir)  # a newcomer judged this job dead and took over
        assert not lock.beat()
        monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.01)
        lost = threading.Event()
        seen = []
        lock.start(on_lost=lambda _, holder: (seen.append(holder["host"]), lost.set()))
        assert lost.wait(30) and seen == ["node-b"] and lock.lost
    finally:
        lock.release()
    assert (run_dir / LOCK_FILE).exists()  # not ours any more: left to its holder


def test_a_released_lock_leaves_no_folder_it_created_and_nothing_was_written_in(tmp_path):
    new = tmp_path / "runs" / "a" / "run"
    RunLock.take(new).release()
    assert not (tmp_path / "runs").exists()
    lock = RunLock.take(new)
    (new / "metrics.jsonl").write_text("{}\n")  # the run wrote something: its folder stays
    lock.release()
    assert sorted(p.name for p in new.iterdir()) == ["metrics.jsonl"]


def test_a_holder_killed_by_a_signal_is_not_judged_alive_by_a_reused_pid(tmp_path):
    """The holder's pid now names another live process (pid reuse): its start time tells them apart."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = dict(runlock.me(run_dir), pid=other.pid, start="1")  # that pid, but a process started at tick 1
        (run_dir / LOCK_FILE).write_text(json.dumps(record))
        said = []
        RunLock.take(run_dir, say=said.append).release()
        assert said[0].endswith("its process has ended"), said
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
