"""Checks `diffllm launch` makes before it starts or submits anything: the train overrides compose into valid typed
configs for this world size, and every hostfile host answers over SSH. Each failure is one line naming the culprit."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from ..errors import UserError
from .argv import LaunchConfig

if TYPE_CHECKING:
    from ..train.config import TrainConfig


def check_train_overrides(overrides: list[str], world_size: int) -> TrainConfig:
    """Compose configs/train.yaml with the overrides (as `diffllm train` would) and build every typed config, so a
    bad key or value stops here, not hours later in a queue. Raises ValueError naming the key; returns the configs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..budget import branch_points, plan_budget
    from ..config import check_typed, compose, schema_for
    from ..train.config import TrainConfig

    try:
        cfg = compose("train", overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(_unknown_key(overrides) or f"train overrides: {str(e).splitlines()[0]}") from None
    check_typed(cfg, schema_for("train"))  # every key typed (seed=abc: one line), as `diffllm train` checks it
    typed = TrainConfig.from_hydra(cfg)  # every group built and validated, as the Trainer gets it
    budget = plan_budget(typed.trainer, typed.data.seq_len, world_size)
    branch_points(typed.trainer.branch_budgets, typed.optim, budget)  # a bad branch budget too
    return typed


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
