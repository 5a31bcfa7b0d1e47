"""Loss and grad-norm spikes (`trainer.spikes`): each step's values, which every rank agrees on, are tested against a
window of the steps before it; a spike is counted and logged, and with action=skip|stop its update is dropped on
every rank. The test, for the step's mean loss (all-reduced in step.py's agree()) and its pre-clip global grad norm:

    z(x; H) = (x - mean(H)) / std(H)       H: the last `window` values before this step, std with n - 1
    spike   = |H| >= warmup  and  std(H) > 0  and  z(x; H) > z_max            (one-sided: a drop is no spike)

The step's own value is not in H. After it is judged it joins H, a spike clipped to the threshold mean(H) + z_max
std(H) (winsorized): one huge spike does not blind the test for the next `window` steps (as it would if it entered
whole, OLMo-core's choice), and a lasting shift is still absorbed after a bounded number of flagged steps (in
simulation, with window 128 and z_max 6, a shift of 10 std is flagged 4 times, of 100 std 22 times, of 1000 std 42
times). Non-finite steps are the non-finite check's (step.py, optim.py): they are never spikes and never enter H.
Everything here is plain float64 arithmetic on values that all ranks share, and `SpikeHistory` is checkpointed in
TrainState, so a relaunch makes the same decisions as an uninterrupted run.

When the grad norm is known: without ZeRO in fp32, before engine.step() (step.py's plain_grad_norm, read back in the
step's agreement); under ZeRO (and bf16) only inside DeepSpeed's step, after it computed the (all-reduced) norm and
before it calls the optimizer on the first parameter group. The decision is therefore made inside the optimizer step,
once per step, through the UpdateGate (optim.py) the optimizer was built with, on every stage alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from .config import SpikesConfig


@dataclass
class SpikeHistory:
    """What the test remembers (checkpointed with TrainState): the windows and the counts."""

    losses: list = field(default_factory=list)  # the last `window` finite step losses, oldest first
    norms: list = field(default_factory=list)  # the last `window` finite pre-clip global grad norms
    spikes: int = 0  # steps judged spikes (loss or grad norm)
    skipped: int = 0  # of them, steps whose update was dropped (action=skip|stop)
    skips_in_a_row: int = 0  # spikes skipped in a row up to the last step
    max_grad_norm: Optional[float] = None  # the largest finite global grad norm of any step, skipped ones included


def mean_std(values: list) -> Optional[tuple[float, float]]:
    """(mean, sample std) of `values` in float64, exactly summed; None with fewer than 2 values."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


@dataclass(frozen=True)
class Verdict:
    """One step's judgement: its values, their z-scores (None: not tested), which of them spiked, and the values
    that enter the windows (a spike clipped to its threshold; None: nothing enters)."""

    loss: float
    grad_norm: Optional[float]
    z_loss: Optional[float]
    z_grad: Optional[float]
    what: tuple  # () or a subset of ("loss", "grad_norm")
    enters: tuple = (None, None)  # (loss, grad norm) for the windows


def judge(cfg: SpikesConfig, h: SpikeHistory, loss: float, grad_norm: Optional[float]) -> Verdict:
    """The test of one step against the history before it (nothing is changed)."""
    finite = math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))
    zs, spiked, enters = [], [], []
    for x, values, z_max in ((loss, h.losses, cfg.z_loss), (grad_norm, h.norms, cfg.z_grad)):
        window = values[-cfg.window :]  # a relaunch may have made trainer.spikes.window smaller
        ms = mean_std(window) if finite and x is not None and z_max and len(window) >= cfg.warmup else None
        z = (x - ms[0]) / ms[1] if ms is not None and ms[1] > 0 else None
        spike = z is not None and z > z_max
        zs.append(z)
        spiked.append(spike)
        enters.append(None if not finite or x is None else ms[0] + z_max * ms[1] if spike else x)
    what = tuple(name for name, spike in zip(("loss", "grad_norm"), spiked) if spike)
    return Verdict(loss, grad_norm, zs[0], zs[1], what, tuple(enters))


def remember(cfg: SpikesConfig, h: SpikeHistory, v: Verdict, dropped: bool) -> None:
    """The step's values join the windows (finite steps only; spikes clipped) and the counts move."""
    loss, norm = v.enters
    if loss is not None:
        h.losses = (h.losses + [loss])[-cfg.window :]
    if norm is not None:
        h.norms = (h.norms + [norm])[-cfg.window :]
        h.max_grad_norm = v.grad_norm if h.max_grad_norm is None else max(h.max_grad_norm, v.grad_norm)
    h.spikes += bool(v.what)
    h.skipped += dropped
    h.skips_in_a_row = h.skips_in_a_row + 1 if dropped else 0


class SpikeGuard:
    """The trainer's spike handling, step by step (step.py calls it; the loop asks `stopping`):

        guard.begin(history, loss, grad_norm_now)   # after the loss is agreed, before engine.step()
        update_gate.arm(nonfinite, guard.drops)     # action=skip|stop: asked inside the optimizer step
        engine.step()
        fields = guard.end(grad_norm)               # the record's spike fields; the windows move

    `grad_norm_now()` gives the step's pre-clip global grad norm when the optimizer step runs (None: unknown)."""

    def __init__(self, cfg: SpikesConfig):
        self.cfg = cfg
        self.acts = cfg.action != "log"
        self.h: Optional[SpikeHistory] = None
        self.loss, self.norm_now = math.nan, None
        self.verdict: Optional[Verdict] = None
        self.dropped = False

    def begin(self, h: SpikeHistory, loss: float, grad_norm_now: Callable[[], Optional[float]]) -> None:
        self.h, self.loss, self.norm_now, self.verdict, self.dropped = h, loss, grad_norm_now, None, False

    def drops(self) -> bool:
        """Whether this step's update is dropped (judged once per step; DeepSpeed calls the optimizer once per
        parameter group)."""
        if self.verdict is None:
            self.verdict = judge(self.cfg, self.h, self.loss, self.norm_now())
            self.dropped = self.acts and bool(self.verdict.what)
        return self.dropped

    def end(self, grad_norm: Optional[float]) -> dict:
        """After engine.step(): judge the step if the optimizer never asked (action=log, or DeepSpeed skipped a
        non-finite step itself), update the history, and return the record's fields ({} but at a spike)."""
        if self.verdict is None:
            self.verdict = judge(self.cfg, self.h, self.loss, grad_norm)
        v = self.verdict
        remember(self.cfg, self.h, v, self.dropped)
        if not v.what:
            return {}
        return {"spike": "+".join(v.what), "z_loss": v.z_loss, "z_grad": v.z_grad, "spike_grad_norm": v.grad_norm}

    def stopping(self) -> Optional[str]:
        """Why the run stops after this step (action=stop at a spike, or too many skipped spikes in a row), or None."""
        if self.cfg.action == "stop" and self.dropped:
            return "a spike (trainer.spikes.action=stop)"
        if self.h is not None and self.h.skips_in_a_row >= self.cfg.max_consecutive_skips and self.dropped:
            return (
                f"{self.h.skips_in_a_row} spikes skipped in a row (trainer.spikes.max_consecutive_skips="
                f"{self.cfg.max_consecutive_skips})"
            )
        return None
