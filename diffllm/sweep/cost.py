"""What a sweep costs before it runs, in both budget modes: training FLOPs and tokens of the whole grid, and its
GPU-hours on a named cluster from the planner's per-run time (diffllm/scaling/planner.py).

A run's FLOPs are counted as its summary will count them: model_stats' FLOPs per token (at the run's seq_len) x the
tokens it trains. Scratch mode trains every budget D in full. Branch mode trains each stable run to its largest budget
and each cooldown only past its branch point: D - S(D) x global_batch_tokens tokens, S = budget.decay_start (the
prefix is the stable run's). So per (model, axes, seed) with budgets D_1 < ... < D_k:
    scratch = f x (D_1 + ... + D_k),   branch = f x (D_k + sum_{i<k} (D_i - S(D_i) x B)).
GPU-hours = the planner's time for those tokens (FLOPs / (GPUs x peak x MFU), the plan checked to fit in memory) x GPUs:
runs one after another on the whole cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..budget import branch_start
from ..config import compose
from ..counts import parse_count
from ..hardware import lookup
from ..model.accounting import model_stats
from ..scaling.config import PlanConfig
from ..scaling.planner import make_plan
from ..train.config import TrainConfig
from .grid import BUDGET_MODES, Run, SweepConfig, plan_runs, value_text

# Axis keys that can change a run's FLOPs per token, batch or branch points (an lr axis cannot: not composed per value)
COST_PREFIXES = ("model.", "data.", "trainer.", "optim.warmup_steps", "optim.decay_fraction")


@dataclass(frozen=True)
class Cluster:
    """Where the GPU-hours are planned: `gpu=h200 nodes=8 gpus_per_node=8` (mfu as `diffllm plan`'s)."""

    gpu: str
    nodes: int = 1
    gpus_per_node: int = 8
    mfu: float = 0.40


@dataclass(frozen=True)
class Total:
    mode: str
    runs: int
    tokens: int  # trained, a cooldown's shared prefix not counted again
    flops: float
    gpu_hours: Optional[float] = None


def _cost_axes(axes: tuple) -> tuple:
    return tuple((k, v) for k, v in axes if k.startswith(COST_PREFIXES))


class _Costs:
    """Per (model, cost-relevant axes): the composed train config's FLOPs per token, global batch, optim config, and
    with a cluster the planner's seconds per token (composed once each: composing takes a while)."""

    def __init__(self, cfg: SweepConfig, cluster: Optional[Cluster], checked: Optional[dict] = None):
        self.cfg, self.cluster, self._cache = cfg, cluster, {}
        # the jobs' configs the sweep has checked already, by (model, axes): by (model, cost axes) here
        self._checked = {(m, _cost_axes(axes)): tc for (m, axes), tc in (checked or {}).items()}

    def get(self, run: Run) -> tuple[float, int, object, Optional[float]]:
        axes = _cost_axes(run.axes)
        key = (run.model, axes)
        if key not in self._cache:
            tc = self._checked.get(key) or self._compose(run.model, axes)
            batch = parse_count(tc.trainer.global_batch_tokens, "trainer.global_batch_tokens")
            fpt = model_stats(tc.model, tc.data.seq_len).flops_per_token
            per_token = None
            if self.cluster:
                c = self.cluster
                plan = make_plan(
                    tc.model,
                    PlanConfig(
                        seq_len=tc.data.seq_len,
                        global_batch_tokens=str(batch),
                        tokens=str(batch),
                        nodes=c.nodes,
                        gpus_per_node=c.gpus_per_node,
                        gpu=c.gpu,
                        mfu=c.mfu,
                    ),
                )
                per_token = plan.seconds * plan.world / plan.tokens
            self._cache[key] = (fpt, batch, tc.optim, per_token)
        return self._cache[key]

    def _compose(self, model: str, axes: tuple) -> TrainConfig:
        axis_overrides = [f"{k}={value_text(v)}" for k, v in axes]
        return TrainConfig.from_hydra(compose("train", [f"model={model}", *self.cfg.overrides, *axis_overrides]))

    def trained_tokens(self, run: Run) -> int:
        """The tokens a run trains itself: its budget, less the prefix a cooldown shares with its stable run."""
        if run.parent is None:
            return run.tokens
        _, batch, optim, _ = self.get(run)
        key = f"sweep.tokens of {run.model}: budget"
        _, start = branch_start(run.tokens, key, batch, optim)
        return run.tokens - start * batch


def totals(cfg: SweepConfig, cluster: Optional[Cluster] = None, checked: Optional[dict] = None) -> list[Total]:
    """The grid's training tokens, FLOPs (and GPU-hours on `cluster`) in each budget mode, scratch first. Branch mode
    uses the optim config's warmup and decay_fraction whatever the config's own mode (what branching would cost).
    `checked`: train configs already composed, by (model, axes) (the sweep's checked jobs)."""
    costs = _Costs(cfg, cluster, checked)
    out = []
    for mode in BUDGET_MODES:
        runs = plan_runs(cfg, "", mode)
        tokens = flops = hours = 0.0
        for r in runs:
            fpt, _, _, per_token = costs.get(r)
            t = costs.trained_tokens(r)
            tokens, flops = tokens + t, flops + t * fpt
            hours += t * per_token / 3600 if per_token else 0.0
        out.append(Total(mode, len(runs), int(tokens), flops, hours if cluster else None))
    return out


def render(cfg: SweepConfig, result: list[Total], cluster: Optional[Cluster]) -> str:
    """One line per mode, then the ratio: what the dry run prints."""
    where = (
        f" on {cluster.nodes} x {cluster.gpus_per_node} {lookup(cluster.gpu).name} "
        f"({cluster.nodes * cluster.gpus_per_node} "
        f"GPUs, {cluster.mfu:.0%} MFU)"
        if cluster
        else ""
    )
    lines = [f"compute of sweep {cfg.name} in both budget modes (this config: budget_mode={cfg.budget_mode}){where}:"]
    for t in result:
        line = f"  {t.mode:<8} {t.runs:>4} runs  {t.tokens:>22,} tokens  {t.flops:.4g} FLOPs"
        if t.gpu_hours is not None:
            days = t.gpu_hours / (cluster.nodes * cluster.gpus_per_node) / 24
            line += f"  {t.gpu_hours:,.0f} GPU-hours ({days:.1f} days on the cluster)"
        lines.append(line)
    scratch, branch = result
    lines.append(f"  branch / scratch: {branch.flops / scratch.flops:.3f} of the FLOPs")
    return "\n".join(lines)
