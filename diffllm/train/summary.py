"""What a launch reports: the start banner (model, budget, layout) and summary.json (the Summary hook)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .hooks import Hook
from .metrics import device_name, finite_or_none

if TYPE_CHECKING:
    from .loop import Trainer


def banner(t: "Trainer") -> None:
    """The start of a launch: model, budget, layout; the budget's note and a warmup that never ends, said."""
    b, m, st = t.budget, t.model_cfg, t.stats
    t.say(f"{m.name} ({m.arch}): {st.total_params:,} params ({st.nonembedding_params:,} non-embedding), "
          f"{st.flops_per_token:.3g} FLOPs/token")
    t.say(f"budget {b.tokens:,} tokens = {b.steps} steps x {b.global_batch_tokens:,} tokens "
          f"(micro-batch {b.micro_batch_size} x seq {b.seq_len} x grad-accum {b.grad_accum} x {t.ws} ranks); "
          f"ZeRO-{t.trainer.zero_stage}, {t.precision}, {device_name()}, run_dir {t.run_dir}")
    if b.note:
        t.say(f"note: {b.note}")
    if b.steps <= t.optim.warmup_steps and t.optim.schedule != "constant":
        t.say(f"warning: the run has {b.steps} steps and optim.warmup_steps={t.optim.warmup_steps}: the learning "
              f"rate only warms up (to optim.lr at the last step) and never decays", error=True)


def summary_of(t: "Trainer") -> dict:
    """summary.json's record. wall_time_s adds up each launch's time until its last checkpoint: steps that a kill
    threw away (and then were redone) are not counted twice, nor is relaunching a finished run."""
    s, st = t.state, t.stats
    return {
        "model": t.model_cfg.name, "arch": t.model_cfg.arch, "total_params": st.total_params,
        "nonembedding_params": st.nonembedding_params, "tokens": s.tokens, "loss_tokens": s.loss_tokens, "flops": st.flops_per_token * s.tokens,
        "flops_per_token": st.flops_per_token, "steps": s.step, "seq_len": t.budget.seq_len,
        "global_batch_tokens": t.budget.global_batch_tokens, "final_train_loss": finite_or_none(s.last_loss),
        "final_val_loss": finite_or_none(s.last_val_loss), "wall_time_s": round(s.elapsed_s, 3),
        "world_size": t.ws, "zero_stage": t.trainer.zero_stage, "precision": t.precision,
        "device": device_name(), "skipped_steps": s.skipped_steps, "spikes": s.spikes.spikes,
        "spike_skips": s.spikes.skipped, "max_grad_norm": s.spikes.max_grad_norm, "status": "finished", "seed": t.seed,
        "doc_mask": t.data_cfg.doc_mask, "loss_on": t.data_cfg.loss_on,
        "checkpoint": str(t.run_obj.checkpoints_dir / f"step{s.step}"), "run_dir": str(t.run_dir),
        "branch": t.run_obj.branch(),  # a WSD cooldown: parent, step, tokens, parent_config_hash (None otherwise)
    }


class Summary(Hook):
    """summary.json: removed when a launch has steps to train (stale until the run finishes), written (rank 0) when
    the run reaches its budget, before any other hook's on_finish."""

    def on_start(self, trainer: "Trainer") -> None:
        if trainer.state.step < trainer.budget.steps and trainer.rank == 0:
            trainer.run_obj.summary_path().unlink(missing_ok=True)

    def on_finish(self, trainer: "Trainer", summary: dict) -> None:
        if trainer.rank == 0:
            trainer.run_obj.write_summary(summary)
            trainer.say(f"finished: {summary['tokens']:,} tokens, final train loss {summary['final_train_loss']}, "
                        f"val loss {summary['final_val_loss']}, {summary['wall_time_s']:.0f} s -> "
                        f"{trainer.run_obj.summary_path()}")
