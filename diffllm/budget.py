"""Token budgets in whole optimizer steps: `plan_budget` (a budget -> steps, gradient accumulation), the one "whole
number of steps" check, the WSD decay start S(T) and the branch points of a run's branch budgets.

At the bottom of the package (it imports only diffllm.counts and diffllm.errors): the trainer, `diffllm launch`'s
preflight, the sweep's cost table and the scaling baselines all count steps here. The configs it reads are duck-typed
(`BudgetKeys`, `DecayKeys`): train/config.py's TrainerConfig and OptimConfig, or `budget_keys(config.yaml's trainer)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Union

from .counts import parse_count
from .errors import UserError

PAPER_BATCH_TOKENS = 262144  # configs/trainer/paper-scaling.yaml's global batch (Diff Transformer §3.2: 128 x 2048)

Tokens = Union[int, str]  # 1000000, "20M", "10B", "1.5T"


class BudgetKeys(Protocol):
    """What a budget is planned from (the `trainer` group's keys)."""

    tokens: Tokens
    global_batch_tokens: Tokens
    micro_batch_size: int
    round_tokens: bool


class DecayKeys(Protocol):
    """What the WSD decay start depends on (the `optim` group's keys)."""

    schedule: str
    warmup_steps: int
    decay_fraction: float


@dataclass(frozen=True)
class TrainerBudget:
    """BudgetKeys from a resolved config's `trainer` mapping (config.yaml), without building the trainer's config."""

    tokens: Tokens
    global_batch_tokens: Tokens
    micro_batch_size: int = 8
    round_tokens: bool = False


def budget_keys(trainer: Mapping) -> TrainerBudget:
    return TrainerBudget(
        trainer["tokens"],
        trainer["global_batch_tokens"],
        trainer.get("micro_batch_size", 8),
        bool(trainer.get("round_tokens", False)),
    )


@dataclass(frozen=True)
class Budget:
    """How a token budget maps onto steps: tokens = steps x global_batch_tokens, exactly."""

    tokens: int
    global_batch_tokens: int
    micro_batch_size: int
    seq_len: int
    world_size: int
    grad_accum: int
    steps: int
    requested_tokens: Optional[int] = None  # trainer.tokens as asked, when trainer.round_tokens rounded it

    @property
    def note(self) -> Optional[str]:
        """What rounding did to the budget, for the log (None when nothing was rounded)."""
        if self.requested_tokens is None or self.requested_tokens == self.tokens:
            return None
        return (
            f"trainer.tokens={self.requested_tokens} rounded up to {self.tokens} = {self.steps} whole steps of "
            f"{self.global_batch_tokens} tokens (trainer.round_tokens=true)"
        )

    @property
    def sequences_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.world_size


def whole_steps(tokens: Tokens, key: str, global_batch_tokens: int, hint: str = "") -> int:
    """A budget in whole steps of the global batch, or a one-line error naming `key` and the nearest whole budgets
    (`hint`: what else would do)."""
    n, b = parse_count(tokens, key), global_batch_tokens
    if n % b:
        use = f"{n // b * b} or {(n // b + 1) * b}" if n > b else f"{b}"  # one number, never twice
        raise UserError(
            f"{key}={tokens}: not a whole number of steps of trainer.global_batch_tokens={b}; use {use}{hint}"
        )
    return n // b


def _smaller_micro_batch(batch: int, micro_batch: int, tokens_per_sample_everywhere: int) -> str:
    """The other way out of a global batch below one micro-batch per rank: the largest smaller micro-batch that divides
    it; below the paper's batch (a CPU trainer's on a cluster) trainer=paper-scaling, never when already that big."""
    fits = [m for m in range(micro_batch - 1, 0, -1) if batch % (m * tokens_per_sample_everywhere) == 0]
    change = f"trainer.micro_batch_size={fits[0]}" if fits else "change trainer.micro_batch_size"
    if batch >= PAPER_BATCH_TOKENS:
        return change
    cpu = "the CPU trainer defaults suit one machine; a paper-size model on a cluster wants trainer=paper-scaling"
    return f"{change} ({cpu})"


def plan_budget(trainer: BudgetKeys, seq_len: int, world_size: int) -> Budget:
    """Gradient accumulation and step count from the global batch in tokens; a combination that does not divide
    exactly is an error naming the keys and the nearest values that would work."""
    tokens = parse_count(trainer.tokens, "trainer.tokens")
    batch = parse_count(trainer.global_batch_tokens, "trainer.global_batch_tokens")
    per_micro = trainer.micro_batch_size * seq_len * world_size
    if batch % per_micro:
        if batch < per_micro:  # smaller than one micro-batch on every rank: CPU trainer defaults on a cluster
            raise UserError(
                f"trainer.global_batch_tokens={batch} is less than one micro-batch on every rank: "
                f"trainer.micro_batch_size x data.seq_len x world size = {trainer.micro_batch_size} x {seq_len} x "
                f"{world_size} = {per_micro}; use {per_micro} or a multiple of it, or "
                + _smaller_micro_batch(batch, trainer.micro_batch_size, seq_len * world_size)
            )
        lo, hi = batch // per_micro * per_micro, (batch // per_micro + 1) * per_micro
        raise UserError(
            f"trainer.global_batch_tokens={batch} is not a multiple of trainer.micro_batch_size x data.seq_len x "
            f"world size = {trainer.micro_batch_size} x {seq_len} x {world_size} = {per_micro}; "
            f"use {lo} or {hi}, or change trainer.micro_batch_size"
        )
    accum = batch // per_micro
    if tokens % batch and trainer.round_tokens:
        rounded = -(-tokens // batch) * batch
        return Budget(
            rounded,
            batch,
            trainer.micro_batch_size,
            seq_len,
            world_size,
            accum,
            rounded // batch,
            requested_tokens=tokens,
        )
    steps = whole_steps(
        tokens, "trainer.tokens", batch, " (the run stops exactly at the budget), or trainer.round_tokens=true"
    )
    return Budget(tokens, batch, trainer.micro_batch_size, seq_len, world_size, accum, steps)


def decay_start(total_steps: int, opt: DecayKeys) -> int:
    """WSD: the first decay step of a run of `total_steps` (total_steps when nothing decays): the last
    decay = max(1, round(decay_fraction x total_steps)) steps decay (none when decay_fraction = 0), never a warmup step:
    start = max(min(warmup_steps, total_steps), total_steps - decay). Every step before it has the same lr in every
    WSD run whose start is not earlier, which is what a branch (diffllm/train/checkpoints/branch.py) is saved at."""
    decay = max(1, round(opt.decay_fraction * total_steps)) if opt.decay_fraction > 0 else 0
    return total_steps if decay == 0 else max(min(opt.warmup_steps, total_steps), total_steps - decay)


def check_after_warmup(steps: int, opt: DecayKeys, key: str, tokens: Tokens) -> None:
    """A budget shorter than the warmup warms up to its own end: no prefix is shared with a longer run."""
    if steps <= opt.warmup_steps:
        raise UserError(
            f"{key}={tokens}: {steps} steps, not more than optim.warmup_steps={opt.warmup_steps}; a "
            f"branch must decay after the warmup: use a larger budget"
        )


def branch_start(tokens: Tokens, key: str, global_batch_tokens: int, opt: DecayKeys) -> tuple[int, int]:
    """A branch budget -> (its steps, its branch step S(steps)): whole steps, past the warmup."""
    steps = whole_steps(tokens, key, global_batch_tokens)
    check_after_warmup(steps, opt, key, tokens)
    return steps, decay_start(steps, opt)


def branch_points(budgets: list, opt: DecayKeys, budget: Budget) -> dict[int, int]:
    """trainer.branch_budgets -> {branch step S(D): budget D in tokens} of a WSD run of `budget`."""
    if not budgets:
        return {}
    if opt.schedule != "wsd" or opt.decay_fraction == 0:
        raise UserError(
            f"trainer.branch_budgets: branches need a decay to branch into: optim.schedule=wsd with "
            f"optim.decay_fraction > 0 (got optim.schedule={opt.schedule}, "
            f"optim.decay_fraction={opt.decay_fraction})"
        )
    points = {}
    for i, tokens in enumerate(budgets):
        key = f"trainer.branch_budgets[{i}]"
        steps = whole_steps(tokens, key, budget.global_batch_tokens)
        if steps > budget.steps:
            raise UserError(
                f"{key}={tokens}: beyond this run's budget trainer.tokens={budget.tokens} ({steps} > "
                f"{budget.steps} steps); a branch budget is at most the run's own"
            )
        _, start = branch_start(tokens, key, budget.global_batch_tokens, opt)
        points[start] = steps * budget.global_batch_tokens
    return points


@dataclass(frozen=True)
class Branching:
    """A WSD run's branching in steps (`plan_branching`): `points` {branch step S(D): budget D in tokens} where it keeps
    a checkpoint for each of its trainer.branch_budgets, and, for a cooldown (trainer.branch_from), `start`: S(steps),
    the step where its own budget begins to decay, the parent's checkpoint it starts from."""

    points: dict[int, int]
    start: Optional[int] = None


class BranchKeys(BudgetKeys, Protocol):
    branch_budgets: list
    branch_from: Optional[str]


def plan_branching(trainer: BranchKeys, opt: DecayKeys, budget: Budget) -> Branching:
    """The branch points of trainer.branch_budgets and a cooldown's start (past the warmup), or a one-line error."""
    points = branch_points(trainer.branch_budgets, opt, budget)
    if not trainer.branch_from:
        return Branching(points)
    check_after_warmup(budget.steps, opt, "trainer.tokens", trainer.tokens)
    return Branching(points, decay_start(budget.steps, opt))
