"""AdamW with decay/no-decay parameter groups, and a step that is skipped on every rank when gradients are non-finite
or its UpdateGate drops the update (a non-finite loss, a spike)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ..model.parametrization import lr_mult, treatments, width_mult
from .config import OptimConfig
from .dist import all_reduce_max


def no_decay(name: str, p: nn.Parameter) -> bool:
    """Norm weights and biases get no weight decay (everything 1-D is one of those)."""
    return p.dim() < 2 or name.rsplit(".", 1)[-1] == "bias"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """model: a DecoderLM; what its attention variants keep from decay (Diff: the lambdas) joins the no-decay group.
    Under parametrization=mup each group is split by its parameters' lr multiplier (`lr_mult`, which the step
    multiplies the scheduled lr by; a hidden matrix's weight decay times width_mult): at width_mult 1 the groups
    are sp's."""
    decay, plain = [], []
    exempt = {id(p) for p in model.no_decay_parameters()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if no_decay(name, p) or id(p) in exempt else decay).append((name, p))
    groups = [("decay", decay, weight_decay), ("no_decay", plain, 0.0)]
    if model.cfg.parametrization == "mup":
        return [g for label, params, wd in groups for g in mup_groups(model, label, params, wd)]
    return [{"params": [p for _, p in params], "weight_decay": wd, "group": label} for label, params, wd in groups]


def mup_groups(model: nn.Module, label: str, params: list, weight_decay: float) -> list[dict]:
    """One group per lr multiplier, in the order first met: {"params", "weight_decay", "group", "lr_mult"}."""
    kinds, m = treatments(model), width_mult(model.cfg)
    split: dict[float, dict] = {}
    for name, p in params:
        mult = lr_mult(kinds[name], m)
        wd = weight_decay * m if kinds[name] == "hidden" else weight_decay  # mup.MuAdamW: lr x wd unchanged
        split.setdefault(mult, {"params": [], "weight_decay": wd, "group": label, "lr_mult": mult})["params"].append(p)
    return list(split.values()) or [{"params": [], "weight_decay": weight_decay, "group": label, "lr_mult": 1.0}]


class UpdateGate:
    """Whether this step's update is dropped, on every rank alike: the one decision that crosses into DeepSpeed's
    optimizer step, handed to SkipStepAdamW when it is built. Per step:

        gate.arm(nonfinite_loss, judge)   # before engine.step(): a non-finite loss drops it; `judge()` (a spike
        engine.step()                     #   test that needs the grad norm) is asked inside the optimizer step
        skipped = gate.disarm()           # whether the optimizer dropped the update

    `closed()`: every update in the block is dropped (DeepSpeed's bf16 initialisation step)."""

    def __init__(self) -> None:
        self.force = False
        self.judge: Optional[Callable[[], bool]] = None
        self.skipped = False

    def arm(self, nonfinite_loss: bool, judge: Optional[Callable[[], bool]] = None) -> None:
        self.force, self.judge, self.skipped = nonfinite_loss, judge, False

    def drops(self) -> bool:
        """This rank's wish to drop the update (the optimizer agrees it across ranks with the gradient check)."""
        return self.force or (self.judge is not None and self.judge())

    def disarm(self) -> bool:
        skipped, self.force, self.judge = self.skipped, False, None
        return skipped

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        self.force = True
        try:
            yield
        finally:
            self.force = False


class SkipStepAdamW(torch.optim.AdamW):
    """torch AdamW whose `step` does nothing, on all ranks alike, when any rank sees a non-finite gradient or its
    `gate` (UpdateGate) drops the update (a non-finite loss; a spike: diffllm/train/spikes.py). Under ZeRO, DeepSpeed
    calls this on every rank with that rank's (clipped, averaged) fp32 gradient partition, once per parameter group
    (or sub-group), after it computed the global grad norm, so the check covers the whole model and the gate's judge
    can read that norm. Adam's moments and step count stay untouched by a skipped step."""

    def __init__(self, params, gate: Optional[UpdateGate] = None, **kwargs):
        super().__init__(params, **kwargs)
        self.gate = gate or UpdateGate()

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        # one sum per gradient tensor (NaN and inf survive a sum; a finite fp32 gradient does not overflow it)
        bad = self.gate.drops() or (bool(grads) and not bool(torch.stack([g.sum() for g in grads]).isfinite().all()))
        self.gate.skipped = all_reduce_max(bad)
        if self.gate.skipped:
            return None
        return super().step(closure)


def build_optimizer(model: nn.Module, opt: OptimConfig, gate: UpdateGate) -> SkipStepAdamW:
    """fused/foreach are left to torch's defaults; the lr is set by the trainer before every step."""
    return SkipStepAdamW(param_groups(model, opt.weight_decay), gate, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)
