"""WSD branches: one run per size trains to its largest budget and keeps a checkpoint where each smaller budget's decay
begins (`trainer.branch_budgets`); a cooldown is its own run that starts from that checkpoint with its own budget
(`trainer.branch_from=<the run> trainer.tokens=<its budget>`), as Hägele et al. 2024 and OLMo-core's ladder do.

Why a cooldown equals a from-scratch WSD run of its budget D bit for bit: with S(T) = schedule.decay_start(T), the
first decay step of a run of T steps, lr_at(s, T) is warmup or the peak lr for every s < S(T), the same for every
T >= D once warmup_steps <= D; S is non-decreasing in T, so the long run's steps before S(D) had exactly the lr, data
and RNG draws of the D-step run. Its checkpoint at S(D) carries weights, optimizer, data-stream and RNG state (the
resume machinery: resume.py, state.py), and the cooldown continues with lr_at(s, D) for s >= S(D). What would break
this is refused in one line before anything is written: another lr, warmup, schedule, batch, seed, data or model than
the parent's (resume.py `branch_source`: config.yaml key by key), a parent that is a branch itself, a budget beyond the
parent's, or no checkpoint at S(D). The cooldown records its origin in branch.json (diffllm.runs) and in summary.json, and starts
its metrics.jsonl with the parent's records up to the branch step; a relaunch resumes its own checkpoints.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..counts import parse_count
from ..runs import Run, read_metrics
from .hooks import Hook
from .schedule import decay_start
from ..errors import UserError

if TYPE_CHECKING:
    from .config import Budget, OptimConfig, TrainConfig
    from .loop import Trainer

def budget_steps(tokens, key: str, global_batch_tokens: int) -> int:
    """A budget in whole steps of the global batch, or a one-line error naming `key`."""
    n, b = parse_count(tokens, key), global_batch_tokens
    if n % b:
        use = f"{n // b * b} or {(n // b + 1) * b}" if n > b else f"{b}"
        raise UserError(f"{key}={tokens}: not a whole number of steps of trainer.global_batch_tokens={b}; use {use}")
    return n // b


def branch_points(cfg: "TrainConfig", budget: "Budget") -> dict[int, int]:
    """trainer.branch_budgets -> {branch step S(D): budget D in tokens} of this run (a WSD run of `budget`)."""
    budgets, opt = cfg.trainer.branch_budgets, cfg.optim
    if not budgets:
        return {}
    if opt.schedule != "wsd" or opt.decay_fraction == 0:
        raise UserError(f"trainer.branch_budgets: branches need a decay to branch into: optim.schedule=wsd with "
                         f"optim.decay_fraction > 0 (got optim.schedule={opt.schedule}, "
                         f"optim.decay_fraction={opt.decay_fraction})")
    points = {}
    for i, tokens in enumerate(budgets):
        key = f"trainer.branch_budgets[{i}]"
        steps = budget_steps(tokens, key, budget.global_batch_tokens)
        if steps > budget.steps:
            raise UserError(f"{key}={tokens}: beyond this run's budget trainer.tokens={budget.tokens} ({steps} > "
                             f"{budget.steps} steps); a branch budget is at most the run's own")
        check_after_warmup(steps, opt, key, tokens)
        points[decay_start(steps, opt)] = steps * budget.global_batch_tokens
    return points


def check_after_warmup(steps: int, opt: "OptimConfig", key: str, tokens) -> None:
    """A budget shorter than the warmup warms up to its own end: no prefix is shared with a longer run."""
    if steps <= opt.warmup_steps:
        raise UserError(f"{key}={tokens}: {steps} steps, not more than optim.warmup_steps={opt.warmup_steps}; a "
                         f"branch must decay after the warmup: use a larger budget")


class BranchPoints(Hook):
    """Asks for a checkpoint at every branch step (CheckpointManager never prunes them: `pinned`)."""

    def __init__(self, points: dict[int, int]):
        self.steps = set(points)

    def on_step_end(self, trainer: "Trainer", record: dict) -> None:
        if trainer.state.step in self.steps:
            trainer.request_save()


def pinned_tags(points: dict[int, int]) -> tuple[str, ...]:
    return tuple(f"step{s}" for s in sorted(points))


def begin(run: Run, record: dict) -> None:
    """Rank 0, when a branch starts from its parent: branch.json, and metrics.jsonl up to the branch step (the
    parent's records: the branch's curve is then the whole of a from-scratch run's)."""
    run.write_branch(record)
    run.write_metrics([r for r in read_metrics(record["parent"]) if r.get("step", 0) <= record["step"]])


def describe(record: dict, say: Callable[[str], None]) -> None:
    say(f"branch: from {record['parent']} at step {record['step']} ({record['tokens']:,} of its "
        f"{record['parent_tokens']:,} tokens; parent config {record['parent_config_hash']}): the cooldown starts here")
