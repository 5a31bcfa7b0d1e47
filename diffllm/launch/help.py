"""`diffllm launch --help`: what the command does, every option (a LaunchConfig field) with its meaning and default
(configs/launch.yaml, then configs/launch/<launcher>.yaml), and examples."""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from ..config import find_config, load_group
from .argv import LaunchConfig

MEANING = {
    "launcher": "torchrun (c10d rendezvous, no SSH) | deepspeed (hostfile, pdsh/SSH) | slurm (sbatch script)",
    "nodes": "number of nodes",
    "procs": "processes (GPUs) per node",
    "hostfile": "deepspeed: `host slots=N` lines; the first --nodes hosts are used",
    "master_addr": "rendezvous host (node rank 0); required by torchrun with --nodes > 1",
    "master_port": "rendezvous port on --master-addr",
    "node_rank": "torchrun with --nodes > 1: this node's rank, 0 on --master-addr",
    "rdzv_id": "torchrun rendezvous id (SLURM: the job id)",
    "rdzv_timeout_s": "torchrun: seconds the nodes wait for each other; then the missing node ranks are named",
    "ds_launcher": "deepspeed's multi-node backend: pdsh | slurm | openmpi | mvapich",
    "shutdown_timeout_s": "torchrun: seconds workers get to save a checkpoint after a signal, then SIGKILL",
    "dry_run": "print the command (or sbatch script) and run nothing",
    "gpu": "GPU type to check memory for, as `diffllm plan gpu=` (empty: this machine's GPU, none without one)",
    "memory_check": "refuse a run `diffllm plan` says does not fit on --gpu (false: launch anyway)",
    "job_name": "slurm: --job-name, and the script's file name",
    "partition": "slurm: --partition",
    "account": "slurm: --account",
    "qos": "slurm: --qos",
    "time": "slurm: time limit (--time)",
    "gpus_per_node": "slurm: --gpus-per-node (empty: --procs; 0: none, for CPU clusters)",
    "exclusive": "slurm: the whole node (false: --cpus-per-task, default procs x (data.num_workers + 1))",
    "cpus_per_task": "slurm: --cpus-per-task (one task per node runs torchrun)",
    "mem": "slurm: --mem per node (0: all; empty: the cluster's default)",
    "signal_lead_s": "slurm: SIGUSR1 this many seconds before the time limit: save, exit 3, requeue",
    "requeue": "slurm: requeue the job after a signal so that it resumes from the checkpoint",
    "log_dir": "slurm: folder for the script and the job logs (%x-%j.out)",
    "container_image": "slurm: pyxis/enroot image for srun --container-image",
    "container_mounts": "slurm: srun --container-mounts",
    "setup": "slurm: a shell line run before srun (repeatable), e.g. 'source .venv/bin/activate'",
    "env": "KEY=VALUE for the workers (repeatable): exported in the slurm script, on every deepspeed host",
    "script": "slurm: where to write the script (empty: <log-dir>/<job-name>.sbatch)",
    "submit": "slurm: sbatch the script (false: only write it)",
}

EXAMPLES = """\
examples:
  diffllm launch --procs 2 model=diff-tiny                        # one node, 2 processes, torchrun
  diffllm launch --nodes 2 --procs 8 --master-addr node-1 --node-rank 0 model=diff-830m trainer=paper-scaling  # rank 1 on node-2
  diffllm launch --launcher slurm --nodes 4 --procs 8 --gpu h100 --partition gpu --time 48:00:00 model=diff-13.1b data=fineweb-edu trainer=paper-scaling trainer.zero_stage=2 trainer.micro_batch_size=1 optim=paper-scaling optim.lr=7.5e-4
  diffllm launch --launcher deepspeed --hostfile hosts --nodes 2 --procs 8 --dry-run model=diff-830m trainer=paper-scaling
"""


def _defaults() -> dict:
    base = OmegaConf.load(find_config("", "launch"))
    merged = OmegaConf.merge(OmegaConf.structured(LaunchConfig), base, load_group("launch", "slurm"))
    values = OmegaConf.to_container(merged)
    values["launcher"] = base.get("launcher", "torchrun")
    return values


def usage() -> str:
    defaults = _defaults()
    rows = []
    for f in dataclasses.fields(LaunchConfig):
        flag = "--" + f.name.replace("_", "-")
        default = defaults[f.name]
        shown = "empty" if default in (None, [], {}) else str(default).lower() if isinstance(default, bool) else default
        rows.append(f"  {flag:<22} {MEANING[f.name]} [default: {shown}]")
    return (
        "usage: diffllm launch [--option VALUE ...] [train overrides ...]\n\n"
        "Builds the command for torchrun, DeepSpeed's runner or SLURM and runs (or submits) it; every argument that\n"
        "is not an option is a `diffllm train` override, checked before anything starts. Exit codes: 0 finished,\n"
        "2 bad input (one line), 3 stopped by a signal after the workers saved (relaunch to continue), else the\n"
        "ranks' own (`diffllm train`'s: said once, with the failed ranks) or the launcher's.\n\noptions:\n"
        + "\n".join(rows)
        + "\n  -h, --help             this text\n\n"
        + EXAMPLES
    )
