"""LaunchConfig and the argv each launcher needs: `deepspeed` (hostfile; pdsh/slurm/openmpi under it) and `torchrun`
(c10d rendezvous, for clusters without SSH between nodes). Every command runs `-m diffllm.train <overrides>`."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .hostfile import check_fits, read_hostfile

LAUNCHERS = ("torchrun", "deepspeed", "slurm")
TRAIN_MODULE = "diffllm.train"
# torchrun forwards these to the workers (SIGUSR1: SLURM's early warning); the trainer saves and exits 3 on them.
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass
class LaunchConfig:
    launcher: str = "torchrun"  # torchrun | deepspeed | slurm
    nodes: int = 1
    procs: int = 1  # processes (GPUs) per node
    hostfile: Optional[str] = None  # deepspeed: `host slots=N` lines
    master_addr: Optional[str] = None  # rendezvous host; None: localhost (1 node) or, under SLURM, the first node
    master_port: int = 29500  # slurm: 0 (configs/launch/slurm.yaml) derives it from the job id
    node_rank: Optional[int] = None  # torchrun with nodes > 1: this node's rank (0 on the master_addr host)
    rdzv_id: str = "diffllm"
    rdzv_timeout_s: int = 600  # torchrun: how long the nodes wait for each other before giving up
    ds_launcher: str = "pdsh"  # deepspeed's multi-node backend: pdsh | slurm | openmpi | mvapich
    shutdown_timeout_s: int = 240  # torchrun: how long workers may take to save after a signal before SIGKILL
    dry_run: bool = False
    gpu: Optional[str] = None  # the GPU type memory is checked for, as `diffllm plan gpu=` (None: this machine's GPU)
    memory_check: bool = True  # false: launch even when diffllm plan says the run does not fit in GPU memory
    # SLURM (launcher=slurm)
    job_name: str = "diffllm"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: str = "24:00:00"
    gpus_per_node: Optional[int] = None  # None: procs; 0: ask for no GPUs (CPU-only clusters)
    exclusive: bool = False  # the whole node (configs/launch/slurm.yaml: true); false: cpus_per_task below
    cpus_per_task: Optional[int] = None  # per node (one srun task per node runs torchrun); None and not exclusive:
    # procs x (data.num_workers + 1), a core for each rank and each of its data workers
    mem: Optional[str] = None  # per node, e.g. 0 (all of it; configs/launch/slurm.yaml) or 500G
    signal_lead_s: int = 300  # SIGUSR1 this long before the time limit: save, exit 3, requeue
    requeue: bool = True
    log_dir: str = "logs/slurm"
    container_image: Optional[str] = None  # pyxis/enroot: srun --container-image (e.g. a .sqsh built from docker/)
    container_mounts: Optional[str] = None
    # shell lines before srun (module load ..., source .venv/bin/activate)
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # for the workers: in the job script, on every deepspeed host
    script: Optional[str] = None  # where to write the sbatch script (None: <log_dir>/<job_name>.sbatch)
    submit: bool = True  # sbatch the script (false: write it only)

    def validate(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise UserError(f"launcher={self.launcher}: expected one of {', '.join(LAUNCHERS)}")
        if self.nodes < 1 or self.procs < 1:
            raise UserError(f"nodes={self.nodes}, procs={self.procs}: both must be >= 1")
        if self.launcher == "torchrun" and self.nodes > 1:
            if not self.master_addr:
                raise UserError(
                    f"--nodes {self.nodes}: torchrun needs --master-addr <host of node rank 0> (the "
                    f"rendezvous host every node can reach) and --node-rank 0..{self.nodes - 1}"
                )
            if self.node_rank is None or not 0 <= self.node_rank < self.nodes:
                given = "missing" if self.node_rank is None else f"{self.node_rank} is out of range"
                raise UserError(
                    f"--node-rank: {given}; with --nodes {self.nodes} give each node its rank, "
                    f"0..{self.nodes - 1} (0 on --master-addr {self.master_addr})"
                )
        if self.rdzv_timeout_s < 1:
            raise UserError(f"--rdzv-timeout-s {self.rdzv_timeout_s}: must be >= 1")
        if self.signal_lead_s <= self.shutdown_timeout_s and self.launcher == "slurm":
            raise UserError(
                f"signal_lead_s={self.signal_lead_s}: must exceed shutdown_timeout_s="
                f"{self.shutdown_timeout_s}, or SLURM kills the job while it saves"
            )


def tool(name: str) -> str:
    """An executable next to this Python (the venv's torchrun/deepspeed) when there is one, else the bare name."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def torchrun_argv(
    cfg: LaunchConfig,
    overrides: list[str],
    endpoint_host: Optional[str] = None,
    executable: str = "torchrun",
    endpoint_port: Optional[str] = None,
) -> list[str]:
    """The same command on every node: c10d rendezvous at host:port, no SSH needed."""
    host = endpoint_host or cfg.master_addr or "localhost"
    port = cfg.master_port if (cfg.nodes > 1 or cfg.master_addr or endpoint_host) else 0  # 0: a free local port
    port = endpoint_port or port
    argv = [executable, "--nnodes", str(cfg.nodes), "--nproc_per_node", str(cfg.procs)]
    if cfg.node_rank is not None:
        argv += ["--node_rank", str(cfg.node_rank)]
    return argv + [
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{host}:{port}",
        "--rdzv_id",
        cfg.rdzv_id,
        "--rdzv_conf",
        f"join_timeout={cfg.rdzv_timeout_s}",
        "--signals_to_handle",
        FORWARDED_SIGNALS,
        "--shutdown_timeout",
        str(cfg.shutdown_timeout_s),
        "-m",
        TRAIN_MODULE,
        *overrides,
    ]


def deepspeed_argv(cfg: LaunchConfig, overrides: list[str], executable: str = "deepspeed") -> list[str]:
    """DeepSpeed's runner: with a hostfile it reaches the other nodes through `ds_launcher` (pdsh needs SSH)."""
    argv = [executable]
    if cfg.hostfile:
        check_fits(read_hostfile(cfg.hostfile), cfg.nodes, cfg.procs, cfg.hostfile)
        argv += ["--hostfile", cfg.hostfile, "--launcher", cfg.ds_launcher]
    elif cfg.nodes > 1:
        raise UserError(
            f"nodes={cfg.nodes}: the deepspeed launcher needs --hostfile <path> with `host slots=N` "
            f"lines (or --launcher torchrun / slurm)"
        )
    argv += ["--num_nodes", str(cfg.nodes), "--num_gpus", str(cfg.procs), "--master_port", str(cfg.master_port)]
    if cfg.master_addr:
        argv += ["--master_addr", cfg.master_addr]
    return argv + ["--module", TRAIN_MODULE, *overrides]


def shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
