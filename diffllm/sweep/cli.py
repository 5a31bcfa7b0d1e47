"""`diffllm sweep [--config-dir DIR] [sweep=<grid>] [sweep_dir=...] [launcher=basic|submitit_slurm] [shard=i/n]
[dry_run=true [gpu=h200 nodes=8 gpus_per_node=8]]`
runs the grid's pending runs through Hydra multirun (its jobs see DIR through $DIFFLLM_CONFIG_PATH); a dry run also
prints the grid's training tokens and FLOPs in both budget modes, and with `gpu=` its GPU-hours on that cluster;
`diffllm sweep collect [sweep_dir=...] [out=...] [select=optim.lr] [select_by=final_val_loss|recall_acc]`
tabulates the summaries."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from ..config import hydra_app
from ..config import CONFIG_PATH_ENV, build
from ..launch.argv import shell
from ..scaling.config import DEFAULT_SELECT_BY
from .collect import collect, write_tables
from .grid import SweepConfig, multirun_commands, plan_runs, shard_runs, token_label
from ..errors import UserError

LAUNCHERS = ("basic", "submitit_slurm")


def launcher_overrides(launcher: str, extra: list[str]) -> list[str]:
    if launcher not in LAUNCHERS:
        raise UserError(f"launcher={launcher}: expected one of {', '.join(LAUNCHERS)}")
    return ([f"hydra/launcher={launcher}"] if launcher != "basic" else []) + list(extra)


def run_sweep(cfg: DictConfig) -> int:
    grid = build(SweepConfig, cfg.sweep, "sweep")
    runs = shard_runs(plan_runs(grid, cfg.sweep_dir), cfg.get("shard"))
    pending = [r for r in runs if r.status != "finished"]
    for r in runs:
        print(f"{r.status:>10}  {r.run_dir}{_role(r, cfg.sweep_dir)}")
    print(f"{len(runs)} runs: {len(runs) - len(pending)} finished (skipped), {len(pending)} to run", flush=True)
    commands = multirun_commands(pending, grid, cfg.sweep_dir, launcher_overrides(cfg.launcher,
                                                                                    cfg.launcher_overrides))
    # The jobs inherit the user's config directories (--config-dir / $DIFFLLM_CONFIG_PATH) through the environment.
    env = f"{CONFIG_PATH_ENV}={shlex.quote(os.environ[CONFIG_PATH_ENV])} " if os.environ.get(CONFIG_PATH_ENV) else ""
    worst = 0
    for argv in commands:
        print(env + shell(argv), flush=True)
        if not cfg.dry_run:
            worst = max(worst, subprocess.call(argv))
    if cfg.dry_run:
        from .cost import Cluster, render, totals  # composes train configs: only a dry run needs it

        cluster = Cluster(cfg.gpu, cfg.nodes, cfg.gpus_per_node, cfg.mfu) if cfg.get("gpu") else None
        print(render(grid, totals(grid, cluster), cluster))
    return worst


def _role(r, sweep_dir: str) -> str:
    """Branch mode: what a run is in its family."""
    if r.branch_budgets:
        return f"  (stable; branches at {', '.join(token_label(b) for b in r.branch_budgets)})"
    if r.parent is not None:
        return f"  (cooldown from {Path(r.parent).relative_to(sweep_dir)})"
    return ""


def main() -> None:
    @hydra_app("sweep")
    def app(cfg: DictConfig) -> None:
        sys.exit(run_sweep(cfg))

    app()


def collect_main() -> None:
    @hydra_app("sweep")
    def app(cfg: DictConfig) -> None:
        select, by = cfg.get("select"), cfg.get("select_by") or DEFAULT_SELECT_BY
        records = collect(cfg.sweep_dir, select=select, by=by)
        csv_path, md_path = write_tables(records, cfg.sweep_dir, cfg.get("out") or cfg.sweep_dir, select=select, by=by)
        print(Path(md_path).read_text(), end="")
        print(f"{len(records)} runs -> {csv_path}, {md_path}", file=sys.stderr)

    app()
