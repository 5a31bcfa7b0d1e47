"""A sweep's jobs checked before anything is printed, written or queued: each pending run's train config composed and
validated as `diffllm launch` checks one (keys, values, context length, the budget in whole steps at the job's world
size), so that a misspelt axis is one line naming the job and the key, not the first job's death in a queue.

Composing is what takes the time (a fraction of a second a config; a micro sweep has 168 runs): Hydra composes one job
per model, with its first axis values; a model's other axis values (scalars of `group.key`s, the same keys) are set
on a copy of that config and only their groups are built again; each run's budget (tokens, branch budgets) is
checked on its own. An axis that is a group choice (`optim: [a, b]`) is composed by Hydra for every value."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from ..config import build
from ..errors import UserError
from ..train.app import SCHEMA
from .grid import Run, SweepConfig, job_overrides

if TYPE_CHECKING:
    from ..train.config import TrainConfig


def check_jobs(runs: list[Run], grid: SweepConfig, sweep_dir: str | Path, world_size: int) -> dict[tuple, TrainConfig]:
    """Every run's job checked (see the module); returns the typed train configs by (model, axes)."""
    from ..launch.checks import check_budget

    typed: dict[tuple, TrainConfig] = {}
    first: dict[str, tuple[DictConfig, TrainConfig]] = {}  # per model: its first job as Hydra composed it
    for r in runs:
        try:
            if (r.model, r.axes) not in typed:
                typed[(r.model, r.axes)] = _job_config(r, grid, sweep_dir, first)
            tc = typed[(r.model, r.axes)]
            trainer = dataclasses.replace(tc.trainer, tokens=r.tokens, branch_budgets=list(r.branch_budgets))
            check_budget(dataclasses.replace(tc, trainer=trainer), world_size)
        except UserError as e:
            raise UserError(f"the job of {r.run_dir}: {e}") from None
    return typed


def _job_config(
    r: Run, grid: SweepConfig, sweep_dir: str | Path, first: dict[str, tuple[DictConfig, TrainConfig]]
) -> TrainConfig:
    from ..launch.checks import compose_train

    if r.model not in first or any("." not in key for key, _ in r.axes):
        cfg, tc = compose_train(job_overrides(r, grid, sweep_dir))
        first.setdefault(r.model, (cfg, tc))
        return tc
    cfg, tc = first[r.model]
    cfg = copy.deepcopy(cfg)
    for key, value in r.axes:
        OmegaConf.update(cfg, key, value, merge=False)
    groups = {key.split(".", 1)[0] for key, _ in r.axes}
    tc = dataclasses.replace(tc, **{g: build(SCHEMA[g], cfg[g], g) for g in groups})
    return tc
