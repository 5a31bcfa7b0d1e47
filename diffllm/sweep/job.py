"""One job of a sweep's Hydra multirun: `python -m diffllm.sweep.job --multirun model=a,b trainer.tokens=... ...`.
Hydra composes the train config for each job (basic launcher: one after another here; submitit_slurm: one SLURM job
each); the job skips a finished run and otherwise trains it in a child process (`python -m diffllm.train`, or
`torchrun` across the job's nodes/GPUs under SLURM), so a failing run cannot end the sweep and memory is returned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..config import hydra_app
from ..launch.argv import LaunchConfig, tool, torchrun_argv
from ..runs import Run
from ..train.app import SCHEMA


def child_argv(overrides: list[str], env: dict[str, str]) -> list[str]:
    """A plain process for one device; torchrun when SLURM gave the job several nodes or GPUs."""
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    procs = int(env.get("SLURM_GPUS_ON_NODE", "1"))
    if nodes * procs == 1:
        return [sys.executable, "-m", "diffllm.train", *overrides]
    head = subprocess.run(
        ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    cfg = LaunchConfig(nodes=nodes, procs=procs, rdzv_id=env.get("SLURM_JOB_ID", "diffllm"))
    return torchrun_argv(cfg, overrides, endpoint_host=head, executable=tool("torchrun"))


@hydra_app("train", SCHEMA)
def _job(cfg: DictConfig, typed: dict) -> int:
    run_dir = Path(cfg.run_dir)
    try:
        finished = Run(run_dir).is_finished()
    except ValueError as e:  # a damaged summary.json (or run_dir is a file): the trainer refuses it in one line too
        print(f"[diffllm.sweep] {e}", file=sys.stderr, flush=True)
        finished = False
    if finished:
        print(f"[diffllm.sweep] {run_dir}: finished, skipped", flush=True)
        return 0
    overrides = list(HydraConfig.get().overrides.task)
    argv = child_argv(overrides, dict(os.environ))
    print(f"[diffllm.sweep] {run_dir}: {'resuming' if run_dir.exists() else 'starting'}", flush=True)
    code = subprocess.call(argv)
    if code:
        print(
            f"[diffllm.sweep] {run_dir}: exit code {code} (rerun the sweep to resume it)", file=sys.stderr, flush=True
        )
    return code


if __name__ == "__main__":
    _job()
