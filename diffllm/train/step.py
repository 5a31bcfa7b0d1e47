"""One optimizer step, the body of the loop (`Step`): grad_accum micro-batches, the step's one agreement across ranks
(mean loss, a stop signal, a save wish: `Asks`), the skip of a non-finite step or a spike (spikes.py) through the
optimizer's UpdateGate (optim.py), and the metrics record of the step."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from .dist import all_reduce_sum, world_size
from .hooks import Hooks, lm_loss
from .metrics import finite_or_none
from .schedule import lr_at

if TYPE_CHECKING:
    from ..budget import Budget
    from .config import OptimConfig
    from .signals import StopFlag
    from .spikes import SpikeGuard
    from .state import TrainState
    from .watchdog import Watchdog


@dataclass
class Asks:
    """What hooks and signals ask of a step, agreed across ranks in its one collective: a stop signal that reached
    some rank, a save some rank wished for (`request_save(agree=True)`: a clock); and the save requested for the end
    of this step (`request_save()`, or an agreed wish), which the loop makes and clears."""

    stop: StopFlag
    save_wish: bool = False
    save: bool = False

    def request_save(self, agree: bool = False) -> None:
        if agree:
            self.save_wish = True
        else:
            self.save = True


class Step:
    """One optimizer step: owns the engine, its optimizer (whose UpdateGate drops an update on every rank), the data
    loader and the spike guard. `step(state, hooks, asks)` -> (the step's record, whether any rank asked to stop)."""

    def __init__(
        self,
        engine,
        optimizer,
        loader,
        spikes: SpikeGuard,
        budget: Budget,
        optim: OptimConfig,
        zero_stage: int,
        device: torch.device,
        watchdog: Watchdog,
    ):
        self.engine, self.optimizer, self.gate = engine, optimizer, optimizer.gate
        self.loader, self.spikes, self.budget, self.optim = loader, spikes, budget, optim
        self.zero_stage, self.device, self.watchdog = zero_stage, device, watchdog

    def __call__(self, state: TrainState, hooks: Hooks, asks: Asks) -> tuple[dict, bool]:
        """grad_accum micro-batches, then the update. Hooks see it through on_step_start (before the first batch is
        read), on_loss (each micro-batch's loss, before backward) and on_before_update; the watchdog hears of every
        phase."""
        t0 = time.perf_counter()
        engine, accum = self.engine, self.budget.grad_accum
        lr = lr_at(state.step, self.budget.steps, self.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)  # mup: per-group multipliers (optim.param_groups)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        loss_tokens = 0  # this rank's targets that count in the loss
        self.watchdog.beat("data")
        hooks.call("on_step_start")
        for micro in range(accum):
            self.watchdog.beat("data")
            batch = next(self.loader).to(self.device)  # a Batch of (B, T+1) windows
            loss_tokens += batch.loss_tokens()
            self.watchdog.beat("forward/backward")
            loss = hooks.loss(lm_loss(engine, batch))
            engine.backward(loss)  # DeepSpeed divides by grad_accum
            loss_sum += loss.detach()
            if micro == accum - 1:  # the update happens in the engine.step() below: agree first
                self.watchdog.beat("loss all-reduce")
                mean_loss, stop, loss_tokens = agree(asks, loss_sum.item(), loss_tokens, accum)
                plain_norm = plain_grad_norm(engine, self.zero_stage)
                self.spikes.begin(state.spikes, mean_loss, lambda: step_grad_norm(engine, plain_norm))  # noqa: B023 - this step's norm
                # judged inside the optimizer step: a non-finite loss, or (action=skip|stop) a spike
                self.gate.arm(not math.isfinite(mean_loss), self.spikes.drops if self.spikes.acts else None)
                ds_skipped = engine.skipped_steps
                hooks.call("on_before_update")
                self.watchdog.beat("optimizer step")
            engine.step()
        skipped = self.gate.disarm() or engine.skipped_steps > ds_skipped  # ours, or DeepSpeed's own check
        return self.count(state, lr, mean_loss, loss_tokens, skipped, plain_norm, t0), stop

    def count(
        self,
        state: TrainState,
        lr: float,
        mean_loss: float,
        loss_tokens: int,
        skipped: bool,
        plain_norm: Optional[float],
        t0: float,
    ) -> dict:
        """The counters move (state) and the step's record."""
        s = state
        s.step, s.tokens = s.step + 1, s.tokens + self.budget.global_batch_tokens
        s.loss_tokens += loss_tokens
        s.skipped_steps += skipped
        norm = step_grad_norm(self.engine, plain_norm)
        spike = self.spikes.end(None if norm is None else float(norm))  # {} but at a spike
        nonfinite = skipped and not self.spikes.dropped
        s.nonfinite_in_a_row = s.nonfinite_in_a_row + 1 if nonfinite else 0
        s.last_loss = mean_loss
        return {
            "step": s.step,
            "tokens": s.tokens,
            "loss_tokens": s.loss_tokens,
            "loss": finite_or_none(mean_loss),
            "lr": lr,
            "grad_norm": None if norm is None or nonfinite else finite_or_none(float(norm)),
            "step_time_s": time.perf_counter() - t0,
            "skipped": skipped,
            **spike,
        }


def agree(asks: Asks, local_loss_sum: float, local_loss_tokens: int, grad_accum: int) -> tuple[float, bool, int]:
    """The step's one collective: (mean loss over ranks and micro-batches, a stop signal reached some rank, the
    step's targets counted in the loss on all ranks). A save that some rank wished for becomes every rank's request."""
    total, stop, wish, counted = all_reduce_sum(
        [local_loss_sum, float(asks.stop.received is not None), float(asks.save_wish), float(local_loss_tokens)]
    )
    asks.save_wish = False
    if wish > 0:
        asks.request_save()
    return total / (grad_accum * world_size()), stop > 0, int(counted)


def step_grad_norm(engine, plain_norm: Optional[float]) -> Optional[float]:
    """The step's pre-clip global grad norm, the same on every rank: DeepSpeed's under ZeRO (its optimizer computes
    it at the start of its step; the engine copies it after), else `plain_norm`."""
    norm = getattr(engine.optimizer, "_global_grad_norm", None)
    norm = engine.get_global_grad_norm() if norm is None else norm
    return plain_norm if norm is None else float(norm)


def plain_grad_norm(engine, zero_stage: int) -> Optional[float]:
    """Without ZeRO, DeepSpeed clips fp32 gradients but does not keep their norm: take it here, before clipping (the
    gradients are already averaged over ranks). ZeRO stages report their own."""
    if zero_stage != 0:
        return None
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else None
