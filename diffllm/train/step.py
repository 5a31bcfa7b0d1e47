"""One optimizer step, the body of the loop (`Step`): grad_accum micro-batches, the step's one agreement across ranks
(mean loss, counted targets, a stop signal, a save wish: `Asks`), the step's one decision to skip it (a non-finite loss
or gradient, a spike: spikes.py) through the optimizer's UpdateGate (optim.py), and the metrics record of the step.

What the host waits for (a GPU runs ahead of the host until the host reads a value back): nothing per micro-batch
(batches are pinned and copied without waiting, the loss and the counted targets add up on the device), one readback
in the agreement (the packed sums after their all-reduce) and, under ZeRO or bf16, one read of the global grad norm
that DeepSpeed computes inside its step (the decision and the record both use it). Without ZeRO in fp32 the norm is
ours, taken before the agreement and read back with it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from .dist import all_reduce_, world_size
from .hooks import Hooks
from .loss import lm_loss
from .metrics import finite_or_none
from .schedule import lr_at

if TYPE_CHECKING:
    from .checkpoints.state import TrainState
    from .config import OptimConfig
    from .context import LaunchContext
    from .signals import StopFlag
    from .spikes import SpikeGuard


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
    """One optimizer step of the launch `ctx` (its budget, device and watchdog beat) under `optim`'s schedule: owns the
    engine, its optimizer (whose UpdateGate drops an update on every rank), the data loader and the spike guard.
    `step(state, hooks, asks)` -> (the step's record, whether any rank asked to stop)."""

    def __init__(self, ctx: LaunchContext, optim: OptimConfig, engine, optimizer, loader, spikes: SpikeGuard):
        self.budget, self.device, self.beat, self.optim = ctx.budget, ctx.device, ctx.beat, optim
        self.engine, self.optimizer, self.gate = engine, optimizer, optimizer.gate
        self.loader, self.spikes = loader, spikes

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
        counted = torch.zeros((), dtype=torch.float64, device=self.device)  # this rank's targets that count
        self.beat("data")
        hooks.call("on_step_start")
        for micro in range(accum):
            self.beat("data")
            batch = next(self.loader).to(self.device, non_blocking=True)  # (B, T+1) windows; pinned on CUDA
            counted += batch.loss_token_count()
            self.beat("forward/backward")
            loss = hooks.loss(lm_loss(engine, batch))
            engine.backward(loss)  # DeepSpeed divides by grad_accum
            loss_sum += loss.detach()
            if micro == accum - 1:  # the update happens in the engine.step() below: agree first
                self.beat("loss all-reduce")
                a = agree(asks, loss_sum, counted, plain_grad_norm(engine), accum)
                mean_loss, stop, loss_tokens = a.mean_loss, a.stop, a.loss_tokens
                norm = StepNorm(engine, a.norm)
                self.spikes.begin(state.spikes, mean_loss, norm)
                # judged inside the optimizer step, once: a non-finite loss or gradient, or (action=skip|stop) a spike
                force = not math.isfinite(mean_loss) or a.nonfinite_norm
                self.gate.arm(force, norm, self.spikes.drops if self.spikes.acts else None)
                ds_skipped = engine.skipped_steps
                hooks.call("on_before_update")
                self.beat("optimizer step")
            engine.step()
        skipped = self.gate.disarm() or engine.skipped_steps > ds_skipped  # ours, or DeepSpeed's own check
        return self.count(state, lr, mean_loss, loss_tokens, skipped, norm, t0), stop

    def count(
        self,
        state: TrainState,
        lr: float,
        mean_loss: float,
        loss_tokens: int,
        skipped: bool,
        norm: StepNorm,
        t0: float,
    ) -> dict:
        """The counters move (state) and the step's record."""
        s = state
        s.step, s.tokens = s.step + 1, s.tokens + self.budget.global_batch_tokens
        s.loss_tokens += loss_tokens
        s.skipped_steps += skipped
        grad_norm = norm.value()
        spike = self.spikes.end(grad_norm)  # {} but at a spike
        nonfinite = skipped and not self.spikes.dropped
        s.nonfinite_in_a_row = s.nonfinite_in_a_row + 1 if nonfinite else 0
        s.last_loss = mean_loss
        return {
            "step": s.step,
            "tokens": s.tokens,
            "loss_tokens": s.loss_tokens,
            "loss": finite_or_none(mean_loss),
            "lr": lr,
            "grad_norm": None if grad_norm is None or nonfinite else finite_or_none(grad_norm),
            "step_time_s": time.perf_counter() - t0,
            "skipped": skipped,
            **spike,
        }


@dataclass(frozen=True)
class Agreement:
    """What the step's one collective gives every rank alike."""

    mean_loss: float  # over ranks and micro-batches
    stop: bool  # a stop signal reached some rank
    loss_tokens: int  # the step's targets counted in the loss, all ranks
    norm: Optional[float]  # this rank's grad norm when it is ours (plain_grad_norm), else None
    nonfinite_norm: bool  # some rank's own grad norm is not finite


def agree(
    asks: Asks, loss_sum: torch.Tensor, counted: torch.Tensor, norm: Optional[torch.Tensor], grad_accum: int
) -> Agreement:
    """The step's one collective and its one readback: this rank's loss sum, counted targets, stop signal and save
    wish (and with `norm`, our grad norm, whether it is finite) packed into one float64 tensor on the device, summed
    over ranks, read back together with `norm` itself. A save that some rank wished for becomes every rank's
    request."""
    pack = torch.zeros(5 if norm is None else 6, dtype=torch.float64, device=loss_sum.device)
    pack[0], pack[1] = loss_sum, counted  # device copies; the flags below are fills: the host waits for nothing
    pack[2], pack[3] = float(asks.stop.received is not None), float(asks.save_wish)
    if norm is not None:
        pack[4] = (~torch.isfinite(norm)).double()
    all_reduce_(pack[:5])
    if norm is not None:
        pack[5] = norm.double()  # this rank's own (the gradients were averaged: every rank's is the same)
    total, counted_all, stop, wish, bad, *mine = pack.tolist()  # the readback
    asks.save_wish = False
    if wish > 0:
        asks.request_save()
    ours = mine[0] if mine else None
    return Agreement(total / (grad_accum * world_size()), stop > 0, int(counted_all), ours, bad > 0)


class StepNorm:
    """The step's pre-clip global grad norm, the same on every rank, read once (a host sync when it is a device
    tensor): DeepSpeed's under ZeRO or bf16, which its optimizer computes at the start of its step (so read inside
    the optimizer step, or after it), else ours, already agreed (`ours`). Calling it gives the value; None: none."""

    def __init__(self, engine, ours: Optional[float]):
        self.engine, self.ours = engine, ours
        self.read, self._value = False, None

    def __call__(self) -> Optional[float]:
        return self.value()

    def value(self) -> Optional[float]:
        if not self.read:
            self._value, self.read = deepspeed_grad_norm(self.engine, self.ours), True
        return self._value


def deepspeed_grad_norm(engine, ours: Optional[float]) -> Optional[float]:
    """DeepSpeed's global grad norm of this step (its optimizer's, which the engine copies after the step), else
    `ours`."""
    norm = getattr(engine.optimizer, "_global_grad_norm", None)
    norm = engine.get_global_grad_norm() if norm is None else norm
    return ours if norm is None else float(norm)


def plain_grad_norm(engine) -> Optional[torch.Tensor]:
    """Where DeepSpeed runs our optimizer unwrapped (no ZeRO, fp32), it clips fp32 gradients but does not keep their
    norm: take it here, before clipping (the gradients are already averaged over ranks), as a device tensor (read back
    in the agreement). None where DeepSpeed's optimizer computes its own (ZeRO, or bf16)."""
    if hasattr(engine.optimizer, "_global_grad_norm"):
        return None
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None
