"""Process-group setup (torchrun, the deepspeed launcher, or a plain single process) and the few collectives we use."""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist


def set_env_defaults() -> None:
    """A plain `diffllm train` (no launcher) becomes a world of one; launchers' variables are kept as they are.
    Its rendezvous store listens on port 0, a port the OS picks as it binds: a port chosen beforehand could be taken
    by another process in between (EADDRINUSE), and nobody else needs to know the number in a world of one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "0")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")


def on_gpu() -> bool:
    return os.environ.get("DS_ACCELERATOR", "cpu") == "cuda" and torch.cuda.is_available()


def skip_shm_op() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory allreduce op (60-80 s the first time); gloo gives the same
    results. The module is loaded by name: `import deepspeed.comm.torch as m` would bind the real torch package."""
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def init_distributed(timeout_minutes: float) -> torch.device:
    """gloo on CPU (without DeepSpeed's JIT-compiled shm op, which costs a 60-80 s compile and gives identical
    results), nccl on GPUs. A collective that waits longer than the timeout raises, so a dead rank ends the job."""
    set_env_defaults()
    import deepspeed

    ds_logger = logging.getLogger("DeepSpeed")
    ds_logger.setLevel(logging.WARNING)
    ds_logger.addFilter(lambda record: "untested optimizer" not in record.getMessage())  # ours, on purpose
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)")
    if on_gpu():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device, backend = torch.device("cuda", int(os.environ["LOCAL_RANK"])), "nccl"
    else:
        skip_shm_op()
        device, backend = torch.device("cpu"), "gloo"
    deepspeed.init_distributed(
        dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=timedelta(minutes=timeout_minutes)
    )
    return device


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_max(flag: bool) -> bool:
    """True on every rank if it is True on any."""
    return bool(all_reduce_maxes([float(flag)])[0])


def all_reduce_maxes(values: list[float]) -> list[float]:
    """Element-wise max over ranks, in float64."""
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over ranks in place, on its device (no readback: the host does not wait); `t` itself."""
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


def all_gather_into(t: torch.Tensor) -> torch.Tensor:
    """(world_size, *t.shape): every rank's `t` in rank order, on t's device (no readback: the host does not wait)."""
    if not dist.is_initialized():
        return t.unsqueeze(0)
    out = torch.empty(dist.get_world_size() * t.numel(), dtype=t.dtype, device=t.device)  # gloo: the flat form
    dist.all_gather_into_tensor(out, t.contiguous().flatten())
    return out.view(-1, *t.shape)


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks, in float64."""
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return t.tolist()


def all_gather_object(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
