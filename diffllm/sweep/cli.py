"""`diffllm sweep [--config-dir DIR] [sweep=<grid>] [sweep_dir=...] [launcher=basic|submitit_slurm] [shard=i/n]
[lr_from=<tuning sweep>]
[dry_run=true [gpu=h200 nodes=8 gpus_per_node=8]]`
runs the grid's pending runs through Hydra multirun (its jobs see DIR through $DIFFLLM_CONFIG_PATH); a dry run also
prints the grid's training tokens and FLOPs in both budget modes, and with `gpu=` its GPU-hours on that cluster;
`diffllm sweep collect [sweep_dir=...] [out=...] [select=optim.lr] [select_by=final_val_loss|recall_acc]
[select_protocol=auto|split|quadratic|same] [select_seeds=[..]] [report_seeds=[..]] [keep=[files]]` tabulates the
summaries (with `keep`, copying those files of each run beside the table).
Their own keys (configs/sweep.yaml) are typed by SweepCommandConfig, the grid by
SweepConfig (both named in their registry entries, diffllm/cli/registry.py)."""

from __future__ import annotations

import importlib.util
import math
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from ..config import CONFIG_PATH_ENV, build, hydra_app
from ..errors import UserError
from ..launch.argv import shell
from ..model.presets import load_preset
from ..scaling.config import DEFAULT_SELECT, DEFAULT_SELECT_BY
from ..scaling.horizon import WD, budgets_at, tuned_laws
from ..scaling.transfer import LR, optimum_lrs, tuning_records
from .check import check_jobs
from .collect import check_keep, collect, keep_files, write_tables
from .grid import SweepConfig, multirun_commands, plan_runs, shard_runs, token_label

LAUNCHERS = ("basic", "submitit_slurm")
TRANSFERRING = ("mup", "completep")  # the parametrizations whose tuned lr transfers across width


@dataclass
class SweepCommandConfig:
    """`diffllm sweep` and `diffllm sweep collect`: the keys beside the grid (`sweep.*`, a SweepConfig)."""

    sweep_dir: str = "runs/sweep/${sweep.name}"  # the sweep's folder: one run directory per grid point below it
    launcher: str = "basic"  # basic (jobs one after another here) | submitit_slurm (one SLURM job per run)
    launcher_overrides: list[str] = field(default_factory=list)  # Hydra launcher keys, e.g. hydra.launcher.nodes=1
    shard: Optional[str] = None  # i/n: run every n-th run of the grid from the i-th
    dry_run: bool = False  # print the runs, the multirun commands and the grid's compute only
    gpu: Optional[str] = None  # dry run: also the GPU-hours on this cluster
    nodes: int = 1  # dry run: nodes per job, for the GPU-hours
    gpus_per_node: int = 8  # dry run: GPUs per node, for the GPU-hours
    mfu: float = 0.40  # dry run: model FLOPs utilisation assumed for the GPU-hours
    select: Optional[str] = DEFAULT_SELECT  # collect: the axis best-of-grid chooses over; null: none
    select_by: str = DEFAULT_SELECT_BY  # collect: final_val_loss | final_train_loss | recall_acc
    select_protocol: str = "auto"  # collect: auto | split | quadratic | same (diffllm/scaling/protocol.py)
    select_seeds: Optional[list[int]] = None  # collect, split: the seeds the value is chosen on
    report_seeds: Optional[list[int]] = None  # collect, split: the seeds reported at it
    out: Optional[str] = None  # collect: where runs.csv / runs.md go (null: sweep_dir)
    # collect: files of each run (paths in its folder, e.g. eval/recall.json) copied to <out>/runs/, where runs.csv
    # then points: the per-run data behind a study, committed with its table
    keep: list[str] = field(default_factory=list)
    # a tuning sweep (its directory or collected runs.csv): each model's lr is its arch's fitted optimum there at the
    # base width, transferred by mup (diffllm/scaling/transfer.py); tuned at >= 3 token budgets, each run's lr is the
    # arch's lr*(D) = B·D^-beta at its own budget (diffllm/scaling/horizon.py); the grid then sets no lr
    lr_from: Optional[str] = None
    lr_from_seeds: Optional[list[int]] = None  # lr_from: fit on these seeds of the tuning sweep only (null: every seed)

    def validate(self) -> None:
        launcher_overrides(self.launcher, [])


SCHEMA = {"sweep": SweepConfig, "": SweepCommandConfig}  # the typed configs of configs/sweep.yaml


def launcher_overrides(launcher: str, extra: list[str]) -> list[str]:
    if launcher not in LAUNCHERS:
        raise UserError(f"launcher={launcher}: expected one of {', '.join(LAUNCHERS)}")
    return ([f"hydra/launcher={launcher}"] if launcher != "basic" else []) + list(extra)


def check_launcher_plugin(launcher: str, dry_run: bool) -> None:
    """submitit_slurm is Hydra's plugin (`pip install 'diffllm[slurm]'`): without it every job would fail to compose.
    A real sweep refuses; a dry run (planning on a machine that will not submit) says so and goes on."""
    if launcher != "submitit_slurm" or _importable("hydra_plugins.hydra_submitit_launcher"):
        return
    message = "launcher=submitit_slurm: needs hydra-submitit-launcher (pip install 'diffllm[slurm]')"
    if not dry_run:
        raise UserError(message)
    print(f"note: {message}; the commands below would fail here", file=sys.stderr, flush=True)


def job_world_size(launcher: str, overrides: list[str]) -> int:
    """The ranks each job trains on: one process under the basic launcher; under submitit_slurm the job's nodes x GPUs
    per node (hydra.launcher.nodes, .gpus_per_node; 1 each unless given), as diffllm/sweep/job.py starts torchrun."""
    if launcher == "basic":
        return 1
    given = dict(o.split("=", 1) for o in overrides if "=" in o)
    counts = [given.get(f"hydra.launcher.{key}", "") for key in ("nodes", "gpus_per_node")]
    return math.prod(int(c) if c.isdigit() and int(c) > 0 else 1 for c in counts)  # null (or none given): one


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def with_lr_from(grid: SweepConfig, source: Optional[str], seeds: Optional[list[int]] = None) -> SweepConfig:
    """`lr_from=<tuning sweep>`: every model's `optim.lr` from its arch's runs at the base width there (diffllm/scaling/
    transfer.py: a quadratic in log2 lr over every seed), which mup transfers to any width. A tuning sweep at one
    token budget gives one lr per arch; one at several gives each run its own, lr*(D) = B·D^-β at the run's budget
    (diffllm/scaling/horizon.py: >= 3 budgets spanning >= 16x). The grid must train under mup with a base width
    (`model.parametrization=mup`, `model.base_width=B` in sweep.overrides) and set no lr itself; anything else is a
    one-line error before a run is planned. `seeds`: fit on these tuning seeds only (a prediction pins its lr so that
    seeds the tuning sweep adds later do not move it)."""
    if not source:
        return grid
    given = dict(o.lstrip("+~").split("=", 1) for o in grid.overrides if "=" in o)
    if LR in given or LR in grid.grid or any(LR in axes for axes in grid.grid_by_model.values()):
        raise UserError(f"lr_from={source}: sweep {grid.name} also sets {LR} (overrides or grid); keep one")
    base = given.get("model.base_width", "")
    if given.get("model.parametrization") not in TRANSFERRING or not base.isdigit():
        raise UserError(
            f"lr_from={source}: a tuned lr transfers across width under mup only; put model.parametrization=mup (or "
            f"completep) and model.base_width=<the tuning width> in sweep {grid.name}'s overrides"
        )
    records = tuning_records(source, seeds)
    if len(budgets_at(records, int(base))) > 1:
        if grid.tau_fraction is None and any(r.axes.get(WD) is not None for r in records):
            print(
                f"note: lr_from={source} set each tuning run's weight decay (sweep.tau_fraction); sweep {grid.name} "
                f"sets none, so its runs leave the timescale the lrs were tuned at",
                file=sys.stderr,
                flush=True,
            )
        return _with_laws(grid, source, tuned_laws(records, int(base), source), int(base))
    tuned = optimum_lrs(records, int(base), source)
    by_model = dict(grid.grid_by_model)
    for m in grid.models:
        by_model[m] = {**by_model.get(m, {}), LR: [tuned[_arch_of(m, tuned, source)][0]]}
    print(
        f"lr_from={source}: "
        + ", ".join(f"{a} {lr:g} ({n} runs at d_model {base})" for a, (lr, n) in sorted(tuned.items())),
        flush=True,
    )
    return replace(grid, grid_by_model=by_model)


def _arch_of(model: str, tuned: dict, source: str) -> str:
    arch = load_preset(model).arch
    if arch not in tuned:
        raise UserError(f"lr_from={source}: no {arch} runs to tune {model} on (it has {', '.join(sorted(tuned))})")
    return arch


def _with_laws(grid: SweepConfig, source: str, laws: dict, base: int) -> SweepConfig:
    """Each model's lr law (its arch's) in the grid, and one line per arch: the law, β's interval, what it rests on."""
    lines = []
    for arch, (law, n) in sorted(laws.items()):
        ci = "" if math.isnan(law.beta_ci[0]) else f" [90%: {law.beta_ci[0]:.3f}, {law.beta_ci[1]:.3f}]"
        span = f"{token_label(min(law.optima))}-{token_label(max(law.optima))}"
        lines.append(
            f"{arch} lr*(D) = {2**law.log2_b:.4g}·D^-{law.beta:.3f}{ci} ({n} runs at d_model {base}, "
            f"{len(law.optima)} budgets {span})"
        )
    print(f"lr_from={source}: " + "; ".join(lines), flush=True)
    law_of = {m: laws[_arch_of(m, laws, source)][0] for m in grid.models}
    return replace(grid, lr_law={m: [law.log2_b, law.beta] for m, law in law_of.items()})


def run_sweep(cfg: DictConfig) -> int:
    grid = with_lr_from(build(SweepConfig, cfg.sweep, "sweep"), cfg.get("lr_from"), cfg.get("lr_from_seeds"))
    check_launcher_plugin(cfg.launcher, cfg.dry_run)
    runs = shard_runs(plan_runs(grid, cfg.sweep_dir), cfg.get("shard"))
    pending = [r for r in runs if r.status != "finished"]
    checked = check_jobs(pending, grid, cfg.sweep_dir, job_world_size(cfg.launcher, cfg.launcher_overrides))
    for r in runs:
        print(f"{r.status:>10}  {r.run_dir}{_role(r, cfg.sweep_dir)}")
    print(f"{len(runs)} runs: {len(runs) - len(pending)} finished (skipped), {len(pending)} to run", flush=True)
    commands = multirun_commands(pending, grid, cfg.sweep_dir, launcher_overrides(cfg.launcher, cfg.launcher_overrides))
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
        print(render(grid, totals(grid, cluster, checked), cluster))
        return worst
    return worst or _unfinished(pending)


def _unfinished(ran: list) -> int:
    """A multirun exits 0 whatever its jobs did (each job says its run's exit code): 1 when a run it ran did not
    finish, with one line naming how many and the first."""
    left = [r for r in ran if r.status != "finished"]
    if left:
        print(
            f"diffllm sweep: {len(left)} of {len(ran)} runs did not finish (first: {left[0].run_dir}; their logs say "
            f"why); rerun the sweep to resume them",
            file=sys.stderr,
            flush=True,
        )
    return 1 if left else 0


def _role(r, sweep_dir: str) -> str:
    """Branch mode: what a run is in its family."""
    if r.branch_budgets:
        return f"  (stable; branches at {', '.join(token_label(b) for b in r.branch_budgets)})"
    if r.parent is not None:
        return f"  (cooldown from {Path(r.parent).relative_to(sweep_dir)})"
    return ""


def main() -> None:
    @hydra_app("sweep", SCHEMA)
    def app(cfg: DictConfig, typed: dict) -> None:
        sys.exit(run_sweep(cfg))

    app()


def collect_main() -> None:
    @hydra_app("sweep", SCHEMA)
    def app(cfg: DictConfig, typed: dict) -> None:
        select, by = cfg.get("select"), cfg.get("select_by") or DEFAULT_SELECT_BY
        protocol = {
            "protocol": cfg.get("select_protocol") or "auto",
            "select_seeds": list(cfg.get("select_seeds") or []) or None,
            "report_seeds": list(cfg.get("report_seeds") or []) or None,
        }
        keep = list(cfg.get("keep") or [])
        check_keep(keep, cfg.sweep_dir, cfg.get("out"))
        records = collect(cfg.sweep_dir, select=select, by=by, **protocol)
        out = cfg.get("out") or cfg.sweep_dir
        if keep:
            records = keep_files(records, cfg.sweep_dir, out, keep)
        root = (Path(out) / "runs").resolve() if keep else cfg.sweep_dir  # runs.md: paths under it
        csv_path, md_path = write_tables(records, root, out, select=select, by=by, **protocol)
        print(Path(md_path).read_text(), end="")
        print(f"{len(records)} runs -> {csv_path}, {md_path}", file=sys.stderr)

    app()
