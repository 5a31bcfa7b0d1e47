"""One optimizer step, the body of the loop: grad_accum micro-batches, the step's one agreement across ranks (mean
loss, a stop signal, a save wish), the skip of a non-finite step or a spike (spikes.py), and the metrics record of
the step."""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Optional

import torch

from .dist import all_reduce_sum
from .hooks import lm_loss
from .metrics import finite_or_none
from .schedule import lr_at

if TYPE_CHECKING:
    from .loop import Trainer


def train_step(t: "Trainer") -> tuple[dict, bool]:
    """One optimizer step over grad_accum micro-batches. Returns (record, whether any rank asked to stop). Hooks see
    it through on_step_start (before the first batch is read) and on_loss (each micro-batch's loss, before backward);
    the watchdog hears of every phase."""
    t0 = time.perf_counter()
    step, accum = t.state.step, t.budget.grad_accum
    lr = lr_at(step, t.budget.steps, t.optim)
    for group in t.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), dtype=torch.float64, device=t.device)
    loss_tokens = 0  # this rank's targets that count in the loss
    t.watchdog.beat("data")
    t.call_hooks("on_step_start")
    for micro in range(accum):
        t.watchdog.beat("data")
        batch = next(t.loader).to(t.device)  # a Batch of (B, T+1) windows
        loss_tokens += batch.loss_tokens()
        t.watchdog.beat("forward/backward")
        loss = lm_loss(t.engine, batch)
        for hook in t.hooks:
            loss = hook.on_loss(t, loss)
        t.engine.backward(loss)  # DeepSpeed divides by grad_accum
        loss_sum += loss.detach()
        if micro == accum - 1:  # the update happens in the engine.step() below: agree first
            t.watchdog.beat("loss all-reduce")
            mean_loss, stop, loss_tokens = agree(t, loss_sum.item(), loss_tokens)
            plain_norm = plain_grad_norm(t.engine, t.trainer.zero_stage)
            t.optimizer.force_skip = not math.isfinite(mean_loss)
            t.spikes.begin(t.state.spikes, mean_loss, lambda: step_grad_norm(t.engine, plain_norm))
            t.optimizer.gate = t.spikes.gate if t.spikes.acts else None  # judged inside the optimizer step
            t.optimizer.skipped, ds_skipped = False, t.engine.skipped_steps
            t.call_hooks("on_before_update")
            t.watchdog.beat("optimizer step")
        t.engine.step()
    skipped = t.optimizer.skipped or t.engine.skipped_steps > ds_skipped  # ours, or DeepSpeed's own check
    t.optimizer.force_skip, t.optimizer.gate = False, None
    s = t.state
    s.step, s.tokens, s.loss_tokens = s.step + 1, s.tokens + t.budget.global_batch_tokens, s.loss_tokens + loss_tokens
    s.skipped_steps += skipped
    norm = step_grad_norm(t.engine, plain_norm)
    spike = t.spikes.end(None if norm is None else float(norm))  # {} but at a spike
    nonfinite = skipped and not t.spikes.dropped
    s.nonfinite_in_a_row = s.nonfinite_in_a_row + 1 if nonfinite else 0
    s.last_loss = mean_loss
    rec = {"step": s.step, "tokens": s.tokens, "loss_tokens": s.loss_tokens, "loss": finite_or_none(mean_loss), "lr": lr,
           "grad_norm": None if norm is None or nonfinite else finite_or_none(float(norm)),
           "step_time_s": time.perf_counter() - t0, "skipped": skipped, **spike}
    return rec, stop


def agree(t: "Trainer", local_loss_sum: float, local_loss_tokens: int) -> tuple[float, bool, int]:
    """The step's one collective: (mean loss over ranks and micro-batches, a stop signal reached some rank, the
    step's targets counted in the loss on all ranks). A save that some rank wished for (`Trainer.request_save(
    agree=True)`: a clock) becomes every rank's request."""
    total, stop, wish, counted = all_reduce_sum([local_loss_sum, float(t.stop.received is not None),
                                                 float(t.save_wish), float(local_loss_tokens)])
    t.save_wish = False
    if wish > 0:
        t.request_save()
    return total / (t.budget.grad_accum * t.ws), stop > 0, int(counted)


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
