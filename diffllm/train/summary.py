"""What a launch reports: the start banner (model, budget, layout) and summary.json (the Summary hook)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from .hooks import Hook, View
from .metrics import device_name, finite_or_none

if TYPE_CHECKING:
    from ..budget import Budget
    from ..model.accounting import ModelStats
    from ..runs import Run
    from .checkpoints.state import TrainState
    from .config import TrainConfig


def banner(cfg: TrainConfig, budget: Budget, stats: ModelStats, precision: str, say: Callable[..., None]) -> None:
    """The start of a launch: model, budget, layout; the budget's note and a warmup that never ends, said."""
    b, m, st, opt = budget, cfg.model, stats, cfg.optim
    say(
        f"{m.name} ({m.arch}): {st.total_params:,} params ({st.nonembedding_params:,} non-embedding), "
        f"{st.flops_per_token:.3g} FLOPs/token"
    )
    say(
        f"budget {b.tokens:,} tokens = {b.steps} steps x {b.global_batch_tokens:,} tokens "
        f"(micro-batch {b.micro_batch_size} x seq {b.seq_len} x grad-accum {b.grad_accum} x {b.world_size} ranks); "
        f"ZeRO-{cfg.trainer.zero_stage}, {precision}, {device_name()}, run_dir {Path(cfg.run_dir)}"
    )
    if b.note:
        say(f"note: {b.note}")
    if b.steps <= opt.warmup_steps and opt.schedule != "constant":
        say(
            f"warning: the run has {b.steps} steps and optim.warmup_steps={opt.warmup_steps}: the learning "
            f"rate only warms up (to optim.lr at the last step) and never decays",
            error=True,
        )


def bad_records(loader) -> int:
    """Records the data skipped as malformed (data.on_bad_record=skip), summed over sources and ranks (collective)."""
    from .dist import all_reduce_sum

    return int(all_reduce_sum([sum(c["bad_records"] for c in loader.consumed().values())])[0])


def summary_of(
    cfg: TrainConfig,
    budget: Budget,
    stats: ModelStats,
    precision: str,
    state: TrainState,
    run: Run,
    skipped_records: int = 0,
    final_val: Optional[dict] = None,
) -> dict:
    """summary.json's record. wall_time_s adds up each launch's time until its last checkpoint: steps that a kill
    threw away (and then were redone) are not counted twice, nor is relaunching a finished run. skipped_records:
    bad_records(loader), the training records skipped as malformed by this launch's loader since the data began.
    final_val: FinalValidation.evaluate's result (the whole held-out set): final_val_loss is its loss; without it,
    the last in-loop validation's (last_val_loss is that one either way)."""
    s, st, m = state, stats, cfg.model
    return {
        "model": m.name,
        "arch": m.arch,
        "total_params": st.total_params,
        "nonembedding_params": st.nonembedding_params,
        "tokens": s.tokens,
        "loss_tokens": s.loss_tokens,
        "flops": st.flops_per_token * s.tokens,
        "flops_per_token": st.flops_per_token,
        "steps": s.step,
        "seq_len": budget.seq_len,
        "global_batch_tokens": budget.global_batch_tokens,
        "final_train_loss": finite_or_none(s.last_loss),
        "final_val_loss": finite_or_none(final_val["loss"] if final_val else s.last_val_loss),
        "last_val_loss": finite_or_none(s.last_val_loss),  # the last in-loop validation (val_batches, spread)
        "final_val": final_val,  # per source loss and tokens, and what was scored
        "wall_time_s": round(s.elapsed_s, 3),
        "world_size": budget.world_size,
        "zero_stage": cfg.trainer.zero_stage,
        "precision": precision,
        "device": device_name(),
        "skipped_steps": s.skipped_steps,
        "spikes": s.spikes.spikes,
        "spike_skips": s.spikes.skipped,
        "max_grad_norm": s.spikes.max_grad_norm,
        "status": "finished",
        "seed": cfg.seed,
        "doc_mask": cfg.data.doc_mask,
        "loss_on": cfg.data.loss_on,
        "bad_records": skipped_records,  # malformed training records skipped (data.on_bad_record=skip)
        "checkpoint": str(run.checkpoints_dir / f"step{s.step}"),
        "run_dir": str(Path(cfg.run_dir)),
        "branch": run.branch(),  # a WSD cooldown: parent, step, tokens, parent_config_hash (None otherwise)
    }


class Summary(Hook):
    """summary.json: removed when a launch has steps to train (stale until the run finishes), written (rank 0) when
    the run reaches its budget, before any other hook's on_finish."""

    def on_start(self, view: View) -> None:
        if view.state.step < view.budget.steps and view.rank == 0:
            view.run.summary_path().unlink(missing_ok=True)

    def on_finish(self, view: View, summary: dict) -> None:
        if view.rank == 0:
            view.run.write_summary(summary)
            view.say(
                f"finished: {summary['tokens']:,} tokens, final train loss {summary['final_train_loss']}, "
                f"val loss {summary['final_val_loss']}, {summary['wall_time_s']:.0f} s -> "
                f"{view.run.summary_path()}"
            )
            if summary.get("bad_records"):
                view.say(f"data: {summary['bad_records']:,} malformed records skipped (data.on_bad_record=skip)")
