"""The sweep grid: presets x token budgets (absolute, or multiples of a tokens-per-parameter rule) x any other
hyperparameter axes (learning rate, lambda_init, ...; per preset where needed) x seeds, one run directory each, and the
Hydra multirun commands that run the pending ones (finished runs are skipped; unfinished ones resume from their
checkpoints because the run directory is the same).

Budget modes (`budget_mode`): `scratch` trains every budget from scratch; `branch` trains one WSD *stable* run per
(model, axes, seed) to the largest budget, keeping a checkpoint where each smaller budget's decay begins
(`trainer.branch_budgets`), and each smaller budget as a *cooldown* from it (`trainer.branch_from`,
diffllm/train/checkpoints/branch.py). A stable run and its cooldowns are one *family*: a shard runs whole families, and
a family's cooldowns are launched after its stable run's multirun returned (the sweep runs its commands in order,
stable runs of a seed before their cooldowns), so a cooldown never waits on another process.

Per-run hyperparameters (scratch mode only): `tau_fraction` sets each run's weight decay from AdamW's timescale
(1/(lr·wd) = that fraction of its steps), `lr_law` (written by `diffllm sweep lr_from=` from a horizon fit) each run's
lr from its token budget; both become axes of the run (its folder says them)."""

from __future__ import annotations

import fnmatch
import itertools
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..budget import whole_steps
from ..counts import parse_count
from ..errors import UserError
from ..model.accounting import model_stats
from ..model.presets import load_preset
from ..results import kaplan_n
from ..runs import Run as RunDir
from ..scaling.horizon import WD, timescale_weight_decay

JOB_MODULE = "diffllm.sweep.job"
BUDGET_MODES = ("scratch", "branch")
BRANCH_KEYS = ("trainer.branch_budgets", "trainer.branch_from")  # set by the sweep itself in branch mode
LR, BATCH = "optim.lr", "trainer.global_batch_tokens"


@dataclass
class SweepConfig:
    name: str = "sweep"  # the grid's name (the default sweep_dir is runs/sweep/<name>)
    models: list[str] = field(default_factory=list)  # the model presets the grid trains
    tokens: list[str] = field(default_factory=list)  # budgets for every model (20M, 1.5B, ...)
    tokens_per_param: list[float] = field(default_factory=list)  # or budgets = k x params (Chinchilla: 20)
    params: str = "total"  # what tokens_per_param multiplies: total | nonembedding | block (no embedding, no head)
    tokens_by_model: dict[str, list[Any]] = field(default_factory=dict)  # per-model budgets (ints or 20M), replacing
    round_tokens_to: int = 1  # round budgets up to a multiple (the global batch: whole optimizer steps)
    seeds: list[int] = field(default_factory=lambda: [1234])  # `seed=` and `data.seed=` of each run
    seeds_by_model: dict[str, list[int]] = field(default_factory=dict)  # per-preset seeds, replacing `seeds`
    grid: dict[str, list[Any]] = field(default_factory=dict)  # extra axes, any Hydra key: {optim.lr: [1e-3, 2e-3]}
    # {"diff-*": {model.lambda_init: [null, 0.8]}}: axes for the presets each glob matches (over `grid`; later wins)
    grid_by_model: dict[str, dict[str, list[Any]]] = field(default_factory=dict)  # axes per preset glob
    overrides: list[str] = field(default_factory=list)  # passed to every run (trainer.*, data.*, optim.*)
    budget_mode: str = "scratch"  # scratch: every budget from scratch | branch: WSD stable run + cooldowns
    # AdamW's timescale 1/(lr·wd) as a fraction f of each run's optimizer steps: set, every run's optim.weight_decay is
    # 1/(lr·f·steps) from its own lr and budget (3 significant digits; docs/scaling.md); null: the overrides' decay
    tau_fraction: Optional[float] = None
    # model -> [log2 B, beta], written by `diffllm sweep lr_from=` from a tuning sweep at >= 3 horizons: each run's
    # optim.lr is B·tokens^-beta (3 significant digits; diffllm/scaling/horizon.py)
    lr_law: dict[str, list[float]] = field(default_factory=dict)

    def validate(self) -> None:
        if not self.models:
            raise UserError("sweep.models: empty; list the presets to sweep")
        for m in self.models:
            load_preset(m)  # unknown preset -> one-line error naming it
        for m in list(self.tokens_by_model) + list(self.seeds_by_model):
            if m not in self.models:
                raise UserError(f"sweep.tokens_by_model/seeds_by_model: {m} is not in sweep.models")
        if self.params not in ("total", "nonembedding", "block"):
            raise UserError(f"sweep.params={self.params}: expected total, nonembedding or block")
        for pattern in self.grid_by_model:
            if not any(fnmatch.fnmatchcase(m, pattern) for m in self.models):
                raise UserError(f"sweep.grid_by_model: {pattern!r} matches none of sweep.models")
        overridden = {o.lstrip("+~").split("=", 1)[0]: o.split("=", 1)[-1] for o in self.overrides}
        self._check_budget_mode(overridden)
        self._check_per_run(overridden)
        for key, values in [*self.grid.items(), *(kv for g in self.grid_by_model.values() for kv in g.items())]:
            where = f"sweep.grid.{key}"
            if key in ("model", "seed", "data.seed", "trainer.tokens", "run_dir", *BRANCH_KEYS):
                raise UserError(f"{where}: {key} is set by the sweep itself (models, seeds, tokens, sweep_dir)")
            if key in overridden:
                raise UserError(f"{where}: {key} is also in sweep.overrides; keep it in one place")
            if not isinstance(values, (list, tuple)) or not values:
                raise UserError(f"{where}: expected a non-empty list of values, got {values!r}")
            if any(isinstance(v, (list, tuple, dict)) for v in values):
                raise UserError(f"{where}: values must be scalars (numbers, strings, null)")
        missing = [m for m in self.models if m not in self.tokens_by_model]
        if missing and not self.tokens and not self.tokens_per_param:
            raise UserError(
                f"sweep.tokens: no budget for {missing[0]} (set tokens, tokens_per_param or tokens_by_model)"
            )

    def _check_budget_mode(self, overridden: dict[str, str]) -> None:
        if self.budget_mode not in BUDGET_MODES:
            raise UserError(f"sweep.budget_mode={self.budget_mode}: expected one of {', '.join(BUDGET_MODES)}")
        for key in BRANCH_KEYS:
            if key in overridden:
                raise UserError(
                    f"sweep.overrides: {key} is set by the sweep itself (sweep.budget_mode=branch "
                    f"makes the branches); remove it"
                )
        if self.budget_mode == "branch" and overridden.get("optim.schedule") != "wsd":
            raise UserError(
                "sweep.budget_mode=branch: branches need a warmup-stable-decay schedule; put "
                "optim.schedule=wsd in sweep.overrides"
            )

    def _check_per_run(self, overridden: dict[str, str]) -> None:
        """tau_fraction and lr_law: what each run's own lr and weight decay need."""
        if not (self.tau_fraction is not None or self.lr_law):
            return
        what = "sweep.tau_fraction" if self.tau_fraction is not None else "lr_from's horizon law"
        if self.budget_mode != "scratch":
            raise UserError(
                f"{what}: sets each budget's own lr and weight decay, but a branch family shares its stable run's; "
                f"use sweep.budget_mode=scratch"
            )
        if self.tau_fraction is None:
            return
        if not self.tau_fraction > 0:
            raise UserError(f"sweep.tau_fraction={self.tau_fraction}: must be > 0 (a fraction of each run's steps)")
        if WD in overridden or any(WD in axes_for(self, m) for m in self.models):
            raise UserError(f"sweep.tau_fraction: sets {WD} per run; remove it from sweep.overrides and the grid")
        if BATCH not in overridden:
            raise UserError(f"sweep.tau_fraction: needs {BATCH} in sweep.overrides (a run's steps = tokens / batch)")


def sig3(x: float) -> float:
    """x to 3 significant digits: what a run's folder and override show, the same on every rerun."""
    return float(f"{x:.3g}")


def per_run_axes(cfg: SweepConfig, model: str, tokens: int, point: tuple) -> tuple[tuple[str, Any], ...]:
    """The axes a run gets from its budget: its lr from `lr_law`, then its weight decay from `tau_fraction`."""
    extra: list[tuple[str, Any]] = []
    if model in cfg.lr_law:
        log2_b, beta = cfg.lr_law[model]
        extra.append((LR, sig3(2.0 ** (log2_b - beta * math.log2(tokens)))))
    if cfg.tau_fraction is not None:
        overridden = dict(o.lstrip("+~").split("=", 1) for o in cfg.overrides if "=" in o)
        lr = dict(point + tuple(extra)).get(LR, overridden.get(LR))
        if lr is None:
            raise UserError(f"sweep.tau_fraction: no {LR} for {model} (in sweep.overrides, its grid, or lr_from)")
        lr = float(lr)
        batch = parse_count(overridden[BATCH], f"sweep.overrides {BATCH}")
        steps = whole_steps(tokens, f"sweep.tokens of {model}", batch)
        extra.append((WD, sig3(timescale_weight_decay(lr, cfg.tau_fraction, steps))))
    return tuple(extra)


def axes_for(cfg: SweepConfig, model: str) -> dict[str, list[Any]]:
    """The extra axes of one preset: `grid`, then every matching `grid_by_model` pattern in order (later wins)."""
    axes = dict(cfg.grid)
    for pattern, grid in cfg.grid_by_model.items():
        if fnmatch.fnmatchcase(model, pattern):
            axes.update(grid)
    return axes


def value_text(v: Any) -> str:
    """A grid value as Hydra reads it back and as a folder name shows it: null, 0.002, 3e-05, true, name."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v) if isinstance(v, float) else str(v)


def axes_label(axes: tuple[tuple[str, Any], ...], keys: list[str]) -> str:
    """The run's folder for its axis values: `lr=0.002,lambda_init=0.8` (a key's last part when that is unique among
    the sweep's axis keys, else the whole key)."""
    tails = [k.rsplit(".", 1)[-1] for k in keys]
    short = {k: t if tails.count(t) == 1 else k for k, t in zip(keys, tails)}
    return ",".join(f"{short[k]}={value_text(v)}" for k, v in axes)


@dataclass(frozen=True)
class Run:
    model: str
    tokens: int
    seed: int
    run_dir: Path
    axes: tuple[tuple[str, Any], ...] = ()  # (key, value) of each extra axis, in the sweep's key order
    branch_budgets: tuple[int, ...] = ()  # branch mode, a stable run: the smaller budgets it keeps a checkpoint for
    parent: Path | None = None  # branch mode, a cooldown: its stable run's run_dir
    parent_tokens: int | None = None  # ... and that run's budget

    @property
    def family(self) -> Path:
        """The stable run a cooldown branches from; any other run is its own family."""
        return self.parent or self.run_dir

    @property
    def status(self) -> str:
        """finished | unfinished (has started: resumes) | new."""
        try:
            if RunDir(self.run_dir).is_finished():
                return "finished"
        except ValueError:  # a damaged summary.json: the trainer will say so when it resumes the run
            return "unfinished"
        return "unfinished" if self.run_dir.exists() else "new"


def token_label(tokens: int) -> str:
    """2000000 -> 2M, 1500000000 -> 1.5B; anything a short label would round stays a plain integer."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if tokens >= scale and tokens % max(scale // 1000, 1000) == 0:
            return f"{tokens / scale:.3f}".rstrip("0").rstrip(".") + suffix
    return str(tokens)


def budgets(cfg: SweepConfig, model: str, vocab_size: int | None = None) -> list[int]:
    if model in cfg.tokens_by_model:
        raw = [parse_count(t, f"sweep.tokens_by_model.{model}") for t in cfg.tokens_by_model[model]]
    else:
        raw = [parse_count(t, "sweep.tokens") for t in cfg.tokens]
        if cfg.tokens_per_param:
            mc = load_preset(model)
            if vocab_size:
                mc.vocab_size = vocab_size
            s = model_stats(mc)
            n = {
                "total": s.total_params,
                "nonembedding": s.nonembedding_params,
                "block": kaplan_n(s, mc.tie_embeddings),
            }[cfg.params]
            raw += [int(k * n) for k in cfg.tokens_per_param]
    step = max(cfg.round_tokens_to, 1)
    return sorted({-(-t // step) * step for t in raw})


def axis_keys(cfg: SweepConfig) -> list[str]:
    """Every extra axis key of the sweep, in first-seen order (the per-run lr and weight decay last)."""
    keys = list(dict.fromkeys(k for m in cfg.models for k in axes_for(cfg, m)))
    derived = ([LR] if cfg.lr_law else []) + ([WD] if cfg.tau_fraction is not None else [])
    return keys + [k for k in derived if k not in keys]


def plan_runs(cfg: SweepConfig, sweep_dir: str | Path, mode: str | None = None) -> list[Run]:
    """Every run of the grid in `mode` (default: the config's budget_mode). Branch mode: per (model, axes, seed) the
    stable run at the largest budget (branch_budgets: the others), then one cooldown per smaller budget, each in the
    run directory scratch mode would give that budget."""
    cfg.validate()
    root, keys = Path(sweep_dir), axis_keys(cfg)
    branch = (mode or cfg.budget_mode) == "branch"
    runs = []
    for m in cfg.models:
        axes = axes_for(cfg, m)
        ordered = [k for k in keys if k in axes]
        tokens = budgets(cfg, m)
        for t in [tokens[-1]] if branch else tokens:
            for combo in itertools.product(*(axes[k] for k in ordered)):
                point = tuple(zip(ordered, combo))
                point += per_run_axes(cfg, m, t, point)  # branch mode (a cost estimate only): the stable run's
                base = lambda b: root / m / token_label(b) / (axes_label(point, keys) if point else "")  # noqa: E731, B023 - called within this iteration
                for s in cfg.seeds_by_model.get(m, cfg.seeds):
                    if not branch:
                        runs.append(Run(m, t, s, base(t) / f"seed{s}", point))
                        continue
                    stable = Run(m, t, s, base(t) / f"seed{s}", point, branch_budgets=tuple(tokens[:-1]))
                    runs += [stable] + [
                        Run(m, d, s, base(d) / f"seed{s}", point, parent=stable.run_dir, parent_tokens=t)
                        for d in tokens[:-1]
                    ]
    return runs


def shard_runs(runs: list[Run], shard: str | None) -> list[Run]:
    """`shard=i/n`: every n-th family (a run; in branch mode a stable run with its cooldowns) from the i-th, so n
    sweeps (processes, machines) split one grid between them and a cooldown is run by the shard of its stable run."""
    if not shard:
        return runs
    i, _, n = str(shard).partition("/")
    if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise UserError(f"shard={shard}: expected i/n with 0 <= i < n, e.g. shard=0/2")
    families = list(dict.fromkeys(r.family for r in runs))[int(i) :: int(n)]
    mine = set(families)
    return [r for r in runs if r.family in mine]


def job_overrides(r: Run, cfg: SweepConfig, sweep_dir: str | Path, models: str | None = None) -> list[str]:
    """The train overrides of a run's job, as its multirun passes them (`models`: the multirun's `a,b,c`; default the
    run's own model). run_dir (and a cooldown's branch_from) name `${model.name}`, resolved per job by Hydra."""
    keys, root = axis_keys(cfg), Path(sweep_dir)

    def folder(tokens: int) -> str:
        return f"{token_label(tokens)}/{axes_label(r.axes, keys)}" if r.axes else token_label(tokens)

    branch = [f"trainer.branch_budgets=[{','.join(map(str, r.branch_budgets))}]"] if r.branch_budgets else []
    if r.parent_tokens is not None:
        branch = [f'trainer.branch_from="{root}/${{model.name}}/{folder(r.parent_tokens)}/seed{r.seed}"']
    return [
        f"model={models or r.model}",
        f"trainer.tokens={r.tokens}",
        f"seed={r.seed}",
        f"data.seed={r.seed}",
        f'run_dir="{root}/${{model.name}}/{folder(r.tokens)}/seed{r.seed}"',
        "trainer.resume=auto",
        *cfg.overrides,
        *(f"{k}={value_text(v)}" for k, v in r.axes),
        *branch,
    ]


def multirun_commands(
    runs: list[Run], cfg: SweepConfig, sweep_dir: str | Path, launcher_overrides: list[str]
) -> list[list[str]]:
    """One Hydra multirun per (budget, seed, axis values[, branch budgets or parent budget]) over the models that still
    need it: `model=a,b,c`; seed by seed, so a sweep cut short has whole seeds; in branch mode a seed's stable runs
    before its cooldowns (`trainer.branch_from=<the stable run of the same model>`)."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.seed, r.parent_tokens is not None, r.tokens, r.axes, r.branch_budgets, r.parent_tokens)].append(r)
    keys = axis_keys(cfg)
    commands = []
    for (seed, _, tokens, axes, _, _), members in sorted(
        groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][2], repr(g[0][3]))
    ):
        folder = f"{token_label(tokens)}/{axes_label(axes, keys)}" if axes else token_label(tokens)
        tag = folder.replace("/", "-") + f"-seed{seed}"
        models = ",".join(r.model for r in members)
        commands.append(
            [
                sys.executable,
                "-m",
                JOB_MODULE,
                "--multirun",
                *job_overrides(members[0], cfg, sweep_dir, models),
                f'hydra.sweep.dir="{Path(sweep_dir)}/.multirun/{tag}"',
                *launcher_overrides,
            ]
        )
    return commands
