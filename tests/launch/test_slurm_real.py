"""`diffllm launch --launcher slurm` against a real SLURM 22.05 (one node on this machine, tests/launch/conftest.py):
a submitted job runs `srun torchrun` with 2 processes to a finished summary; SLURM's own time-limit signal makes the
trainer checkpoint, the job requeue itself and resume, with losses bit-equal to the uninterrupted job; scancel
mid-run leaves only complete checkpoints."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from diffllm.runs import TAG, find_checkpoint, read_metrics
from tests.distributed import base_env
from tests.train.helpers import ENV, comparable, tiny

pytestmark = pytest.mark.slow

STEPS = 300  # of 1024 tokens: 8-60 s on 2 cores, idle or loaded
SLOW_STEP_S = 0.2  # the interrupted jobs' first attempts' steps last >= this (trainer.faults.step_delay_s): >= 60 s
# in all, twice the <= 30 s after which SLURM's signal comes once the limit is cut, so they are still training when it
# (or scancel) comes, however idle the machine. A requeued attempt runs at full speed: the delay comes from the job's
# environment, set by a --setup line only while SLURM_RESTART_COUNT is 0 (step_delay_s is operational: a resume
# accepts the change, and the losses stay those of the plain run)
SLOW_OVERRIDE = "trainer.faults.step_delay_s=${oc.env:DIFFLLM_TEST_STEP_DELAY_S,0}"
SLOW_SETUP = f'[ "${{SLURM_RESTART_COUNT:-0}}" != 0 ] || export DIFFLLM_TEST_STEP_DELAY_S={SLOW_STEP_S}'


def submit(slurm, tmp: Path, name: str, run_dir: Path, *options: str, slow: bool = False) -> tuple[int, Path]:
    """Submit the tiny 2-process run exactly as a user would; returns (job id, its log file). `slow`: in the job's
    first attempt, rank 0 sleeps SLOW_STEP_S per step."""
    train = tiny(
        run_dir,
        1,
        f"trainer.tokens={STEPS * 1024}",
        "trainer.save_every_steps=40",
        "trainer.log_every=1",
        workers=True,
    )
    venv = Path(sys.executable).parent  # as a user's `--setup "source .venv/bin/activate"`: torchrun on the PATH
    job = slurm.launch(
        tmp,
        "--procs",
        "2",
        "--gpus-per-node",
        "0",
        "--job-name",
        name,
        "--log-dir",
        str(tmp / "logs"),
        "--shutdown-timeout-s",
        "20",
        "--setup",
        f"export PATH={venv}:$PATH",
        *(["--setup", SLOW_SETUP] if slow else []),
        *options,
        *train,
        *([SLOW_OVERRIDE] if slow else []),
        env={**base_env(), **ENV},
    )
    return job, tmp / "logs" / f"{name}-{job}.out"


def last_step(run_dir: Path) -> int:
    try:
        return max((m.get("step", 0) for m in read_metrics(run_dir)), default=0)
    except ValueError:  # a line being written
        return 0


def finished(info: dict) -> bool:
    return info.get("JobState") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    """The reference: the same run, submitted with a time limit it never reaches."""
    tmp = tmp_path_factory.mktemp("slurm-ref")
    job, log = submit(slurm, tmp, "ref", tmp / "run", "--time", "10", "--signal-lead-s", "60")
    info = slurm.wait(job, finished, timeout=400)
    return tmp / "run", log, info


def test_submit_runs_srun_torchrun_to_the_end(uninterrupted):
    run_dir, log, info = uninterrupted
    out = log.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), out[-3000:]
    script = (log.parent / "ref.sbatch").read_text()
    assert re.search(r"^srun .*torchrun --nnodes 1 --nproc_per_node 2 ", script, re.M)
    assert re.search(r"job \d+ \(restart 0\) on \S+, rendezvous on \S+", out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], summary["tokens"]) == ("finished", 2, STEPS * 1024)


def runtime_s(info: dict) -> int:
    """scontrol's RunTime ([D-]HH:MM:SS or MM:SS) in seconds."""
    days, _, hms = info["RunTime"].rpartition("-")
    seconds = 0
    for part in hms.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + 86400 * int(days or 0)


def requeued(info: dict) -> bool:
    """Requeued and settled: Restarts counts the requeue while the old allocation is still COMPLETING (its steps
    being cleaned up); only then does the job read PENDING (Reason BeginTime a moment later; None until then)."""
    return int(info.get("Restarts", 0)) > 0 and info.get("JobState") != "COMPLETING"


def test_time_limit_signal_checkpoints_requeues_and_resumes_exactly(slurm, uninterrupted, tmp_path):
    """SLURM's own time-limit warning: once the trainer is stepping, the job's limit is cut to the next whole minute
    after a 60 s margin (`scontrol update TimeLimit`), inside --signal-lead-s 120, so slurmctld sends SIGUSR1 to the
    batch shell at its next time-limit check (every 30 s) and would kill the job at the new limit. The trainer saves
    and exits 3; the script requeues the job. SLURM holds a requeued job for ~2 minutes (Reason=BeginTime): the test
    restores the limit and releases it at once. The resumed job completes with every loss (train and validation)
    equal to the uninterrupted job's, bit for bit."""
    run_dir = tmp_path / "run"
    job, log = submit(slurm, tmp_path, "pre", run_dir, "--time", "10", "--signal-lead-s", "120", slow=True)
    deadline = time.monotonic() + 300
    while last_step(run_dir) < 3:
        assert time.monotonic() < deadline and not finished(slurm.job(job)), log.read_text()[-3000:]
        time.sleep(0.5)
    limit_min = -(-(runtime_s(slurm.job(job)) + 60) // 60)
    slurm.cmd("scontrol", "update", f"JobId={job}", f"TimeLimit={limit_min}")
    info = slurm.wait(job, lambda i: finished(i) or requeued(i), timeout=180)
    assert info.get("JobState") == "PENDING", (info, log.read_text()[-3000:])
    slurm.cmd("scontrol", "update", f"JobId={job}", "TimeLimit=10", "StartTime=now")
    info = slurm.wait(job, finished, timeout=400)
    out = log.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), out[-3000:]
    assert "SIGUSR1 received" in out and f"requeueing {job}" in out, out[-3000:]
    assert "relaunch the same command to continue (exit code 3)" in out
    stopped = int(re.search(r"stopped by SIGUSR1 at step (\d+)", out).group(1))
    resumed = re.findall(r"resumed from checkpoint \S+: step (\d+),", out)
    assert resumed == [str(stopped)] and 3 <= stopped < STEPS, out[-3000:]
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(uninterrupted[0]))


def test_scancel_mid_run_leaves_complete_checkpoints(slurm, tmp_path):
    """scancel: SIGTERM reaches the trainer (through the script's trap and from slurmd); it saves, or at worst is
    killed after KillWait; either way `latest` names a complete checkpoint, no tmp-step<N> remains, and the job is
    not requeued (it was, before the script told SIGTERM from its own time-limit SIGUSR1)."""
    run_dir = tmp_path / "run"
    job, log = submit(slurm, tmp_path, "cancel", run_dir, "--time", "10", "--signal-lead-s", "60", slow=True)
    deadline = time.monotonic() + 300
    while last_step(run_dir) <= 40:
        assert time.monotonic() < deadline and not finished(slurm.job(job)), log.read_text()[-3000:]
        time.sleep(0.5)
    slurm.cmd("scancel", str(job))
    info = slurm.wait(job, finished, timeout=120)
    out = log.read_text()
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), out[-3000:]  # a cancelled job stays so
    assert "SIGTERM received" in out and "stopped by SIGTERM (exit" in out and "not requeued" in out, out[-3000:]
    ckpts = run_dir / "checkpoints"
    saved = find_checkpoint(ckpts)  # `latest` names a complete checkpoint (meta.json written last, atomically)
    assert saved is not None and saved.step >= 40, out[-3000:]
    leftovers = [p.name for p in ckpts.iterdir() if p.is_dir() and not TAG.match(p.name)]
    assert leftovers == [], leftovers  # no tmp-step<N> half-written
    for tag in (p for p in ckpts.iterdir() if TAG.match(p.name)):
        assert find_checkpoint(tag).step == int(TAG.match(tag.name).group(1))
    assert not slurm.cmd("squeue", "-h", "-j", str(job), check=False).strip()
