"""WSD branches: one run per size trains to its largest budget and keeps a checkpoint where each smaller budget's decay
begins (`trainer.branch_budgets`); a cooldown is its own run that starts from that checkpoint with its own budget
(`trainer.branch_from=<the run> trainer.tokens=<its budget>`), as Hägele et al. 2024 and OLMo-core's ladder do.

Why a cooldown equals a from-scratch WSD run of its budget D bit for bit: with S(T) = diffllm.budget.decay_start(T), the
first decay step of a run of T steps, lr_at(s, T) is warmup or the peak lr for every s < S(T), the same for every
T >= D once warmup_steps <= D; S is non-decreasing in T, so the long run's steps before S(D) had exactly the lr, data
and RNG draws of the D-step run. Its checkpoint at S(D) carries weights, optimizer, data-stream and RNG state (the
resume machinery: plan.py, state.py), and the cooldown continues with lr_at(s, D) for s >= S(D). What would break
this is refused in one line before anything is written: another lr, warmup, schedule, batch, seed, data or model than
the parent's (plan.py `branch_source`: config.yaml key by key), a parent that is a branch itself, a budget beyond the
parent's, or no checkpoint at S(D). The cooldown records its origin in branch.json (diffllm.runs) and in summary.json,
and starts
its metrics.jsonl with the parent's records up to the branch step; a relaunch resumes its own checkpoints. The
budget arithmetic (branch points, whole steps, a cooldown's start: `plan_branching`) is diffllm/budget.py's; a launch's
branching is one `BranchPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from ...runs import Run, read_metrics
from ..hooks import Hook

if TYPE_CHECKING:
    from ..hooks import View


class BranchPoints(Hook):
    """Asks for a checkpoint at every branch step (CheckpointManager never prunes them: `pinned`)."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def on_step_end(self, run: View, record: dict) -> None:
        if run.state.step in self.steps:
            run.request_save()


@dataclass(frozen=True)
class BranchPlan:
    """A launch's WSD branching, decided by the resume plan (resume.py) and consumed by the Trainer: `points`
    {branch step S(D): budget D in tokens} where this run keeps a checkpoint for each of trainer.branch_budgets, and
    `source`, when this launch starts a cooldown from its parent's checkpoint, its branch.json record (parent, step,
    tokens, parent_tokens, parent_config_hash; None otherwise, a relaunched branch included)."""

    points: dict = field(default_factory=dict)
    source: Optional[dict] = None

    def pinned_tags(self) -> tuple[str, ...]:
        return tuple(f"step{s}" for s in sorted(self.points))

    def hooks(self) -> list[Hook]:
        return [BranchPoints(set(self.points))] if self.points else []

    def begin(self, run: Run, parent_elapsed_s: Optional[float]) -> None:
        """Rank 0, when a branch starts from its parent: branch.json (with the parent's wall time at the branch; the
        cooldown's own is the rest), and metrics.jsonl up to the branch step (the parent's records: the branch's curve
        is then the whole of a from-scratch run's)."""
        record = {**self.source, "parent_elapsed_s": parent_elapsed_s}
        run.write_branch(record)
        run.write_metrics([r for r in read_metrics(record["parent"]) if r.get("step", 0) <= record["step"]])

    def describe(self, say: Callable[[str], None]) -> None:
        r = self.source
        say(
            f"branch: from {r['parent']} at step {r['step']} ({r['tokens']:,} of its {r['parent_tokens']:,} tokens; "
            f"parent config {r['parent_config_hash']}): the cooldown starts here"
        )
