"""The sweep grid: presets x token budgets (absolute, or multiples of a tokens-per-parameter rule) x seeds, one run
directory each, and the Hydra multirun commands that run the pending ones (finished runs are skipped; unfinished ones
resume from their checkpoints because the run directory is the same)."""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..counts import parse_count
from ..model.accounting import model_stats
from ..model.presets import load_preset
from ..runs import Run as RunDir

JOB_MODULE = "diffllm.sweep.job"


@dataclass
class SweepConfig:
    name: str = "sweep"
    models: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # budgets for every model (20M, 1.5B, ...)
    tokens_per_param: list[float] = field(default_factory=list)  # or budgets = k x params (Chinchilla: 20)
    params: str = "total"  # what tokens_per_param multiplies: total | nonembedding
    tokens_by_model: dict[str, list[Any]] = field(default_factory=dict)  # per-model budgets (ints or 20M), replacing
    round_tokens_to: int = 1  # round budgets up to a multiple (the global batch: whole optimizer steps)
    seeds: list[int] = field(default_factory=lambda: [1234])  # `seed=` and `data.seed=` of each run
    seeds_by_model: dict[str, list[int]] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)  # passed to every run (trainer.*, data.*, optim.*)

    def validate(self) -> None:
        if not self.models:
            raise ValueError("sweep.models: empty; list the presets to sweep")
        for m in self.models:
            load_preset(m)  # unknown preset -> one-line error naming it
        for m in list(self.tokens_by_model) + list(self.seeds_by_model):
            if m not in self.models:
                raise ValueError(f"sweep.tokens_by_model/seeds_by_model: {m} is not in sweep.models")
        if self.params not in ("total", "nonembedding"):
            raise ValueError(f"sweep.params={self.params}: expected total or nonembedding")
        missing = [m for m in self.models if m not in self.tokens_by_model]
        if missing and not self.tokens and not self.tokens_per_param:
            raise ValueError(f"sweep.tokens: no budget for {missing[0]} (set tokens, tokens_per_param or "
                             f"tokens_by_model)")


@dataclass(frozen=True)
class Run:
    model: str
    tokens: int
    seed: int
    run_dir: Path

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
            n = s.total_params if cfg.params == "total" else s.nonembedding_params
            raw += [int(k * n) for k in cfg.tokens_per_param]
    step = max(cfg.round_tokens_to, 1)
    return sorted({-(-t // step) * step for t in raw})


def plan_runs(cfg: SweepConfig, sweep_dir: str | Path) -> list[Run]:
    cfg.validate()
    root = Path(sweep_dir)
    return [Run(m, t, s, root / m / token_label(t) / f"seed{s}")
            for m in cfg.models for t in budgets(cfg, m) for s in cfg.seeds_by_model.get(m, cfg.seeds)]


def multirun_commands(runs: list[Run], cfg: SweepConfig, sweep_dir: str | Path,
                      launcher_overrides: list[str]) -> list[list[str]]:
    """One Hydra multirun per (budget, seed) over the models that still need it: `model=a,b,c`."""
    groups: dict[tuple[int, int], list[str]] = defaultdict(list)
    for r in runs:
        groups[(r.tokens, r.seed)].append(r.model)
    commands = []
    for (tokens, seed), models in sorted(groups.items()):
        label = token_label(tokens)
        commands.append([
            sys.executable, "-m", JOB_MODULE, "--multirun", f"model={','.join(models)}", f"trainer.tokens={tokens}",
            f"seed={seed}", f"data.seed={seed}", f"run_dir={Path(sweep_dir)}/${{model.name}}/{label}/seed{seed}",
            "trainer.resume=auto", *cfg.overrides, f"hydra.sweep.dir={Path(sweep_dir)}/.multirun/{label}-seed{seed}",
            *launcher_overrides,
        ])
    return commands
