"""A real one-node SLURM cluster for the tests (local_slurm.sh beside this file: munged + slurmctld + slurmd on
localhost), and small helpers to submit through `diffllm launch --launcher slurm` and follow a job with scontrol."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from tests.launch.local_service import LocalService

SCRIPT = Path(__file__).with_name("local_slurm.sh")
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def unavailable() -> Optional[str]:
    """Why a local cluster cannot start here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as their users); `make test` as root on Debian installs SLURM"
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return (
            f"no {', '.join(missing)}: `make test` as root on Debian installs slurmctld slurmd slurm-client "
            f"munge (apt-get)"
        )
    return None


class Cluster(LocalService):
    script = SCRIPT
    what = "local SLURM"

    def __init__(self, state_dir: Path):
        super().__init__(state_dir)
        self.env = {**os.environ, "SLURM_CONF": str(state_dir / "slurm.conf")}

    def cmd(self, *argv: str, check: bool = True) -> str:
        out = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=60)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr}")
        return out.stdout

    def launch(self, cwd: Path, *args: str, env: Optional[dict] = None) -> int:
        """`diffllm launch --launcher slurm ... --submit` as a user types it; returns the job id."""
        out = subprocess.run(
            [sys.executable, "-m", "diffllm.cli", "launch", "--launcher", "slurm", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**self.env, **(env or {})},
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return int(re.search(r"Submitted batch job (\d+)", out.stdout).group(1))

    def job(self, job_id: int) -> dict:
        """scontrol's fields of a job (JobState, Restarts, Reason, ExitCode, ...); {} once SLURM has forgotten it."""
        text = self.cmd("scontrol", "-o", "show", "job", str(job_id), check=False)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: int, until: Callable[[dict], bool], timeout: float, every: float = 1.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if until(info):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id}: still {info.get('JobState')} ({info.get('Reason')}) after {timeout:.0f} s"
                )
            time.sleep(every)
