"""Checks `diffllm launch` makes before it starts or submits anything: the train overrides compose into valid typed
configs for this world size (a sweep's dry run checks each of its jobs so too), the run fits in the GPUs' memory as
`diffllm plan` estimates it, and every hostfile host answers over SSH. Each failure is one line naming the culprit."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Optional

from ..errors import UserError
from ..hardware import GPUS
from .argv import LaunchConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..train.config import TrainConfig


def check_train_overrides(overrides: list[str], world_size: int) -> TrainConfig:
    """Compose configs/train.yaml with the overrides (as `diffllm train` would) and build every typed config, so a
    bad key or value stops here, not hours later in a queue. Raises ValueError naming the key; returns the configs."""
    _, typed = compose_train(overrides)
    check_budget(typed, world_size)
    return typed


def compose_train(overrides: list[str]) -> tuple[DictConfig, TrainConfig]:
    """The composed train config and its typed configs, every key and value checked (the budget not yet)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..config import compose
    from ..train.config import TrainConfig

    try:
        cfg = compose("train", overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(_unknown_key(overrides) or f"train overrides: {str(e).splitlines()[0]}") from None
    typed = TrainConfig.from_hydra(cfg)  # every group and root key built and checked, as `diffllm train` does
    return cfg, typed


def check_budget(typed: TrainConfig, world_size: int) -> None:
    """The budget in whole steps at this world size, and every branch budget a whole step before the decay."""
    from ..budget import branch_points, plan_budget

    budget = plan_budget(typed.trainer, typed.data.seq_len, world_size)
    branch_points(typed.trainer.branch_budgets, typed.optim, budget)


def check_memory(typed: TrainConfig, nodes: int, procs: int, gpu: str) -> None:
    """`diffllm plan`'s memory estimate for this run's settings (ZeRO stage, activation checkpointing, offload,
    micro-batch, diagnostics level, trainer.deepspeed's knobs) on `nodes` x `procs` GPUs of type `gpu`: a run that does
    not fit is refused in one line saying what it needs, what the GPUs offer and the setting that would fit."""
    from ..scaling.config import PlanConfig
    from ..scaling.planner import make_plan

    t = typed.trainer
    offload = t.offload_optimizer or t.offload_params
    if offload and t.zero_stage < 2:  # the planner models offload at ZeRO-2 and -3 only
        return
    pc = PlanConfig(
        seq_len=typed.data.seq_len,
        global_batch_tokens=str(t.global_batch_tokens),
        tokens=str(t.tokens),
        nodes=nodes,
        gpus_per_node=procs,
        gpu=gpu,
        zero_stage=t.zero_stage,
        activation_checkpointing=t.activation_checkpointing,
        offload=offload,
        micro_batch_size=t.micro_batch_size,
        diagnostics=t.diagnostics,
        deepspeed=t.deepspeed,
    )
    try:
        make_plan(typed.model, pc, prefix="trainer.")
    except UserError as e:
        raise UserError(f"{e} (--memory-check false: launch anyway)") from None


def local_gpu() -> Optional[str]:
    """This machine's GPU as `diffllm plan` names it (h100, a100-80gb, ...); None without one or for an unlisted one."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0).upper()
    return next((g.name for g in GPUS.values() if any(m in name for m in g.match)), None)


def _unknown_key(overrides: list[str]) -> str | None:
    """`trainer.tokenz=5: unknown key (did you mean trainer.tokens?)` for the first override naming no config key."""
    import difflib

    from omegaconf import DictConfig

    from ..config import compose

    base = compose(
        "train",
        [o for o in overrides if o.split("=", 1)[0].lstrip("~+") in ("model", "data", "trainer", "optim", "logging")],
    )
    for override in overrides:
        key = override.split("=", 1)[0]
        if key.startswith(("+", "~", "hydra")):
            continue
        parent, _, leaf = key.rpartition(".")
        node = base.get(parent) if parent and "." not in parent else (base if not parent else None)
        if isinstance(node, DictConfig) and leaf not in node:
            near = difflib.get_close_matches(leaf, [str(k) for k in node], n=1)
            hint = f" (did you mean {parent + '.' if parent else ''}{near[0]}?)" if near else ""
            return f"{override}: unknown key{hint}"
    return None


def check_hosts_reachable(hosts: list[str], path: str, timeout_s: int = 10) -> None:
    """`ssh host true` for each host, as pdsh will need: one line naming the first host that does not answer."""
    for host in hosts:
        try:
            out = subprocess.run(
                [
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    f"ConnectTimeout={timeout_s}",
                    "-o",
                    "StrictHostKeyChecking=accept-new",
                    host,
                    "true",
                ],
                capture_output=True,
                text=True,
                timeout=timeout_s + 5,
            )
        except FileNotFoundError:
            raise UserError(
                f"hostfile {path}: no `ssh` on this machine to reach {host!r} "
                f"(install openssh-client, or use --launcher torchrun / slurm)"
            ) from None
        except subprocess.TimeoutExpired:
            raise UserError(f"hostfile {path}: host {host!r} did not answer over ssh within {timeout_s} s") from None
        if out.returncode != 0:
            why = (out.stderr.strip().splitlines() or [f"ssh exit code {out.returncode}"])[-1]
            raise UserError(f"hostfile {path}: host {host!r} is not reachable over ssh ({why})")


def needs_ssh(cfg: LaunchConfig) -> bool:
    return cfg.launcher == "deepspeed" and bool(cfg.hostfile) and cfg.ds_launcher == "pdsh"
