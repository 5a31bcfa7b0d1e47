"""Hooks around the training loop (as OLMo-core's callbacks) and the `View` of the run they are given: checkpoint
timing and the step's window metrics live here, not inside the loop (validation, which the loop calls, is
validation.py's; the summary is summary.py's, diagnostics diagnostics.py's, fault injection faults.py's, in-loop
evaluation eval_hook.py's). A new concern (a profiler, generations) is one small class:

    class Generations(Hook):
        def on_validate(self, view, losses):
            view.log({"step": view.state.step, "tokens": view.state.tokens, "sample": sample(view.model().module)})

    Trainer(cfg, hooks=[Generations()]).run()   # runs after the built-in hooks, in list order

A hook sees the run through its `View` only: state, budget, rank and world size, the device, the run directory, the
model through `model()` (the DeepSpeed engine: forwards go through it), and asks through `log(record)` (a record of
its own: metrics.jsonl and W&B, rank 0), `request_save()` (a checkpoint at the end of this step; `agree=True`: one
rank's wish, such as a clock, agreed across ranks in the step's one collective), `say(msg)` and `beat(phase)` (the
step watchdog: a long phase is busy). It contributes to the step's record by returning keys from `on_step_end`; the
record is written once, after every hook, by the loop's one writer (metrics.py MetricsWriter).

Every rank calls every hook at the same points, so a hook may run collectives (forward passes under ZeRO-3, an
all-reduce); work that only rank 0 must do checks `view.rank == 0`. A hook must not draw from the global RNGs
(python, numpy, torch) during training: the checkpointed RNG states would then differ from an uninterrupted run's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch

from .metrics import logged, mfu

if TYPE_CHECKING:
    from ..budget import Budget
    from ..runs import Run
    from .checkpoints.state import TrainState
    from .context import LaunchContext


@dataclass
class View:
    """What a hook sees of the run (the Trainer makes one after setup; a test makes its own): the launch (`ctx`: rank,
    world size, device, budget, run directory, say, beat), the counters, and what the Trainer offers."""

    ctx: LaunchContext
    state: TrainState  # the counters: step (done so far), tokens, ...
    model: Callable[[], Any]  # the DeepSpeed engine (its .module: the DecoderLM)
    log: Callable[[dict], None]  # a record of its own (rank 0 writes it, after the step's record)
    request_save: Callable[..., None]  # request_save(agree=False)
    elapsed: Callable[[], float] = lambda: 0.0  # wall seconds of the run so far (all launches)
    failing: Callable[[], bool] = lambda: False  # too many non-finite steps in a row: the loop stops after this step

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def budget(self) -> Budget:
        return self.ctx.budget

    @property
    def run(self) -> Run:  # the run directory
        return self.ctx.run

    def say(self, msg: str, error: bool = False) -> None:  # rank 0 prints
        self.ctx.say(msg, error=error)

    def beat(self, phase: str) -> None:  # the step watchdog hears that `phase` is busy
        self.ctx.beat(phase)


class Hook:
    """Override what you need; every method is called on every rank."""

    def on_start(self, view: View) -> None:
        """After setup (and a resume, and the step-0 validation), before the first step of this launch."""

    def on_step_start(self, view: View) -> None:
        """Before each optimizer step reads its first batch (view.state.step: the steps done so far)."""

    def on_loss(self, view: View, loss: torch.Tensor) -> torch.Tensor:
        """Each micro-batch's loss before its backward pass; returns the loss to use (fault injection replaces it)."""
        return loss

    def on_before_update(self, view: View) -> None:
        """After the step's last backward and its agreement across ranks, before the optimizer update: the step's
        gradients are complete (under ZeRO, in DeepSpeed's partitions)."""

    def on_step_end(self, view: View, record: Mapping) -> Optional[dict]:
        """After each optimizer step. `record` (read-only): step, tokens, loss_tokens, loss (mean over ranks and
        micro-batches; None if non-finite), lr, grad_norm, skipped, step_time_s; at a spike also spike, z_loss, z_grad,
        spike_grad_norm; and what the hooks before this one returned. Returns keys to add to the record (or None);
        the record is written (every log_every steps, at the last, a skipped or a spiking step) after every hook."""

    def on_validate(self, view: View, losses: dict[str, float]) -> None:
        """After a validation that is recorded: mean token loss per named held-out set."""

    def on_save(self, view: View, tag: str) -> None:
        """After a checkpoint `run_dir/checkpoints/<tag>` is published (every rank has written its part)."""

    def on_finish(self, view: View, summary: dict) -> None:
        """When the run reached its budget, after summary.json was written."""

    def close(self, view: View) -> None:
        """Always, at the end of the launch (finished, stopped or failed): release files, processes, connections."""


class Hooks:
    """The hooks of a launch, called in order with their View."""

    def __init__(self, hooks: list[Hook], view: View):
        self.hooks, self.view = hooks, view

    def call(self, event: str, *args) -> None:
        for hook in self.hooks:
            getattr(hook, event)(self.view, *args)

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        for hook in self.hooks:
            loss = hook.on_loss(self.view, loss)
        return loss

    def step_end(self, record: dict) -> dict:
        """The step's record with every hook's contribution, in hook order (a later hook sees the earlier ones')."""
        record = dict(record)
        for hook in self.hooks:
            record.update(hook.on_step_end(self.view, MappingProxyType(record)) or {})
        return record


class Checkpointing(Hook):
    """Save timing: asks for a save every `every_steps` steps (trainer.save_every_steps), and when `every_minutes`
    (trainer.save_every_minutes) have passed since the last save on this rank's clock (a wish, agreed across ranks in
    the step's one collective). The final, spike and preemption saves are the loop's own."""

    def __init__(self, every_steps: int, every_minutes: float) -> None:
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.last_save_t = time.monotonic()

    def on_start(self, view: View) -> None:
        self.last_save_t = time.monotonic()

    def on_step_start(self, view: View) -> None:
        if self.every_minutes and time.monotonic() - self.last_save_t >= 60 * self.every_minutes:
            view.request_save(agree=True)

    def on_step_end(self, view: View, record: Mapping) -> None:
        if self.every_steps and view.state.step % self.every_steps == 0:
            view.request_save()

    def on_save(self, view: View, tag: str) -> None:
        self.last_save_t = time.monotonic()


class StepMetrics(Hook):
    """The logged record's window statistics: throughput, MFU, wall-clock time, elapsed seconds, skipped steps, the
    spike count, and the mean loss over the steps since the previous record (`loss` is the last step's).
    `flops_per_token` and `peak` (dense TFLOPs of the device; None: no MFU) give MFU."""

    def __init__(self, log_every: int, flops_per_token: float, peak: Optional[float]) -> None:
        self.log_every, self.flops_per_token, self.peak = log_every, flops_per_token, peak
        self.window_t, self.window_losses = 0.0, []

    def on_step_end(self, view: View, record: Mapping) -> Optional[dict]:
        self.window_t += record["step_time_s"]
        self.window_losses.append(record["loss"])
        s, b = view.state, view.budget
        if not logged(record, self.log_every, b.steps):
            return None
        finite = [x for x in self.window_losses if x is not None]
        tokens_per_s = len(self.window_losses) * b.global_batch_tokens / max(self.window_t, 1e-9)
        self.window_t, self.window_losses = 0.0, []
        out = dict(
            loss_mean=sum(finite) / len(finite) if finite else None,
            tokens_per_s=tokens_per_s,
            mfu=mfu(tokens_per_s / view.world_size, self.flops_per_token, self.peak),
            skipped_steps=s.skipped_steps,
            spikes=s.spikes.spikes,
            time=round(time.time(), 3),
            elapsed_s=round(view.elapsed(), 3),
        )
        if record["loss"] is None:
            out["nonfinite"] = True
        return out
