"""Hooks around the training loop (as OLMo-core's callbacks): validation, checkpoint timing and metrics live here,
not inside the loop (the summary is summary.py's, fault injection faults.py's, in-loop evaluation eval_hook.py's).
A new concern (a profiler, generations) is one small class:

    class Generations(Hook):
        def on_validate(self, trainer, losses):
            trainer.log({"step": trainer.state.step, "tokens": trainer.state.tokens,
                         "sample": sample(trainer.engine.module)})

    Trainer(cfg, hooks=[Generations()]).run()   # runs after the built-in hooks, in list order

What a hook may ask of the trainer: `trainer.log(record)` (a metrics.jsonl record, written by rank 0, and W&B),
`trainer.request_save()` (a checkpoint at the end of this step; `agree=True`: one rank's wish, such as a clock,
agreed across ranks in the step's one collective), `trainer.call_hooks(event, ...)` (tell every hook of an event),
`trainer.say(msg)`; and it reads trainer.state, trainer.budget, trainer.engine, trainer.rank.

Every rank calls every hook at the same points, so a hook may run collectives (forward passes under ZeRO-3, an
all-reduce); work that only rank 0 must do checks `trainer.rank == 0`. A hook must not draw from the global RNGs
(python, numpy, torch) during training: the checkpointed RNG states would then differ from an uninterrupted run's.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from .diagnostics import Diagnostics
from .dist import all_reduce_sum
from .metrics import MetricsLog, finite_or_none, mfu, progress_line
from .tracking import open_wandb

if TYPE_CHECKING:
    from ..data import Batch
    from .loop import Trainer

IGNORE = -100  # F.cross_entropy's ignore_index: targets outside the loss mask
MAIN_VAL = "val"  # the validation set named by data.val; its loss is `val_loss` (others: `val_loss/<name>`)


def lm_loss(model, batch: "Batch", reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of `model` on a Batch of windows (B, T+1), in fp32 (float64 logits stay float64): the
    one loss of training and validation. With document ids the model attends within documents. With a loss mask
    (data.loss_on=marked) only the marked targets count: their sum, or for "mean" their sum / their count (0 for
    none; a mask that marks every target gives today's loss bit for bit)."""
    logits = model(batch.inputs, **batch.model_kwargs()).flatten(0, 1)  # (B*T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    mask = batch.target_mask  # (B, T) bool, or None: every target counts
    if mask is None:
        return F.cross_entropy(logits, batch.targets.flatten(), reduction=reduction)
    targets = batch.targets.masked_fill(~mask, IGNORE).flatten()
    total = F.cross_entropy(logits, targets, reduction="sum", ignore_index=IGNORE)
    return total if reduction == "sum" else total / mask.sum().clamp(min=1)


class Hook:
    """Override what you need; every method is called on every rank."""

    def on_start(self, trainer: "Trainer") -> None:
        """After setup (and a resume), before the first step of this launch."""

    def on_step_start(self, trainer: "Trainer") -> None:
        """Before each optimizer step reads its first batch (trainer.state.step: the steps done so far)."""

    def on_loss(self, trainer: "Trainer", loss: torch.Tensor) -> torch.Tensor:
        """Each micro-batch's loss before its backward pass; returns the loss to use (fault injection replaces it)."""
        return loss

    def on_before_update(self, trainer: "Trainer") -> None:
        """After the step's last backward and its agreement across ranks, before the optimizer update: the step's
        gradients are complete (under ZeRO, in DeepSpeed's partitions)."""

    def on_step_end(self, trainer: "Trainer", record: dict) -> None:
        """After each optimizer step. `record`: step, tokens, loss (mean over ranks and micro-batches; None if
        non-finite), lr, grad_norm, skipped, step_time_s; at a spike also spike, z_loss, z_grad, spike_grad_norm.
        Hooks may add keys before MetricsLogger writes it."""

    def on_validate(self, trainer: "Trainer", losses: dict[str, float]) -> None:
        """After a validation that is recorded: mean token loss per named held-out set."""

    def on_save(self, trainer: "Trainer", tag: str) -> None:
        """After a checkpoint `run_dir/checkpoints/<tag>` is published (every rank has written its part)."""

    def on_finish(self, trainer: "Trainer", summary: dict) -> None:
        """When the run reached its budget, after summary.json was written."""

    def close(self, trainer: "Trainer") -> None:
        """Always, at the end of the launch (finished, stopped or failed): release files, processes, connections."""


def val_losses_record(step: int, tokens: int, losses: dict[str, float]) -> dict:
    """The metrics.jsonl record of one validation: val_loss for the main set, val_loss/<name> for the others."""
    rec = {"step": step, "tokens": tokens}
    for name, loss in losses.items():
        rec["val_loss" if name == MAIN_VAL else f"val_loss/{name}"] = finite_or_none(loss)
    return rec


class Validation(Hook):
    """Held-out loss at the start (step 0 is recorded), every `every` steps, and at the end (Trainer.run calls
    `validate`). `sets`: named lists of Batches; the main one is "val". The loss is per counted target token (with
    data.loss_on=marked: the marked ones)."""

    def __init__(self, sets: dict[str, list["Batch"]], every: int):
        self.sets, self.every = sets, every

    def on_start(self, trainer: "Trainer") -> None:
        self.validate(trainer, record=trainer.state.step == 0)

    def on_step_end(self, trainer: "Trainer", record: dict) -> None:
        step = trainer.state.step
        if self.every and step % self.every == 0 and step < trainer.budget.steps and not trainer.failing:
            self.validate(trainer)

    def validate(self, trainer: "Trainer", record: bool = True) -> dict[str, float]:
        losses = {name: self.evaluate(trainer, batches) for name, batches in self.sets.items()}
        main = losses.get(MAIN_VAL, next(iter(losses.values())))
        trainer.state.last_val_loss = main
        trainer.say(f"step {trainer.state.step}: val_loss {main:.4f}" + "".join(
            f", {name} {v:.4f}" for name, v in losses.items() if name != MAIN_VAL))
        if record:
            trainer.call_hooks("on_validate", losses)
        return losses

    @torch.no_grad()
    def evaluate(self, trainer: "Trainer", batches: list["Batch"]) -> float:
        """Mean token loss over `batches`, split over ranks. Every rank runs the same number of forwards (ZeRO-3
        gathers parameters collectively), padding with a zero-weight batch where its share is short."""
        engine, r, ws = trainer.engine, trainer.rank, trainer.ws
        engine.eval()
        mine = batches[r::ws]
        total, count = 0.0, 0
        for i in range(math.ceil(len(batches) / ws)):
            trainer.watchdog.beat("validation")
            batch = (mine[i] if i < len(mine) else batches[0]).to(trainer.device)
            loss = lm_loss(engine, batch, reduction="sum")
            if i < len(mine):
                total, count = total + loss.item(), count + batch.loss_tokens()
        engine.train()
        total, count = all_reduce_sum([total, float(count)])
        return total / count if count else float("nan")


class Checkpointing(Hook):
    """Save timing: asks for a save every trainer.save_every_steps steps, and when trainer.save_every_minutes have
    passed since the last save on this rank's clock (a wish, agreed across ranks in the step's one collective). The
    final and the preemption saves are the loop's own."""

    def __init__(self) -> None:
        self.last_save_t = time.monotonic()

    def on_start(self, trainer: "Trainer") -> None:
        self.last_save_t = time.monotonic()

    def on_step_start(self, trainer: "Trainer") -> None:
        minutes = trainer.trainer.save_every_minutes
        if minutes and time.monotonic() - self.last_save_t >= 60 * minutes:
            trainer.request_save(agree=True)

    def on_step_end(self, trainer: "Trainer", record: dict) -> None:
        every = trainer.trainer.save_every_steps
        if every and trainer.state.step % every == 0:
            trainer.request_save()

    def on_save(self, trainer: "Trainer", tag: str) -> None:
        self.last_save_t = time.monotonic()


class MetricsLogger(Hook):
    """metrics.jsonl (and W&B) on rank 0, and the progress line: one record every log_every steps, at the last step
    and at every skipped or spiking step, with throughput, MFU, wall-clock time, elapsed seconds, the spike count,
    the mean loss over the steps since the previous record (`loss` is the last step's), and the diagnostics of
    diagnostics.py (lambda, attention-output RMS, grad norm, largest activation and attention logit per layer)."""

    def __init__(self) -> None:
        self.log: Optional[MetricsLog] = None
        self.window_t, self.window_losses = 0.0, []
        self.diag: Optional[Diagnostics] = None

    @staticmethod
    def logs_at(trainer: "Trainer", step: int) -> bool:
        """Whether the record of `step` is written (a skipped step's is as well, unforeseen)."""
        return step % trainer.trainer.log_every == 0 or step == trainer.budget.steps

    def arm_for(self, trainer: "Trainer", step: int) -> None:
        """Diagnostics hooks on for the forwards of `step` if its record is written (on every rank alike)."""
        if self.diag is not None and step <= trainer.budget.steps and self.logs_at(trainer, step):
            self.diag.arm()

    def on_start(self, trainer: "Trainer") -> None:
        if hasattr(trainer, "engine"):  # every rank: the hooks are armed, and lambda gathered, on all of them
            self.diag = Diagnostics(trainer.engine.module, trainer.say)
            self.arm_for(trainer, trainer.state.step + 1)
        if trainer.rank != 0:
            return
        self.log = MetricsLog(trainer.run_dir)
        dropped = self.log.truncate_after(trainer.state.step)
        if dropped:
            trainer.say(f"metrics.jsonl: dropped {dropped} records after step {trainer.state.step} "
                        f"(they are redone now)")
        self.log.wandb = open_wandb(trainer.logging, trainer.run_dir, trainer.state.wandb_id, trainer.config)

    def on_step_end(self, trainer: "Trainer", record: dict) -> None:
        self.window_t += record.pop("step_time_s")
        self.window_losses.append(record["loss"])
        s, b = trainer.state, trainer.budget
        logged = self.logs_at(trainer, s.step) or record["skipped"] or "spike" in record
        diagnostics = self.diag.collect(s.step) if self.diag is not None and logged else {}
        self.arm_for(trainer, s.step + 1)
        if not logged:
            return
        steps = len(self.window_losses)
        finite = [x for x in self.window_losses if x is not None]
        tokens_per_s = steps * b.global_batch_tokens / max(self.window_t, 1e-9)
        record.update(loss_mean=sum(finite) / len(finite) if finite else None, tokens_per_s=tokens_per_s,
                      mfu=mfu(tokens_per_s / trainer.ws, trainer.stats.flops_per_token, trainer.peak),
                      skipped_steps=s.skipped_steps, spikes=s.spikes.spikes, time=round(time.time(), 3),
                      elapsed_s=round(trainer.elapsed(), 3))
        if record["loss"] is None:
            record["nonfinite"] = True
        record.update(diagnostics)
        if trainer.rank == 0:
            self.log.write(record)
            eta = (b.steps - s.step) * self.window_t / steps
            print(progress_line(record, b.steps, b.tokens, eta), flush=True)
        self.window_t, self.window_losses = 0.0, []

    def on_before_update(self, trainer: "Trainer") -> None:
        if self.diag is not None and self.diag.armed:
            self.diag.keep_grad_norms()

    def on_validate(self, trainer: "Trainer", losses: dict[str, float]) -> None:
        if trainer.rank == 0:
            self.log.write(val_losses_record(trainer.state.step, trainer.state.tokens, losses))

    def close(self, trainer: "Trainer") -> None:
        if self.log is not None and self.log.wandb is not None:
            self.log.wandb.finish()
