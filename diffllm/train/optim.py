"""AdamW with decay/no-decay parameter groups, and a step that is skipped on every rank when gradients are non-finite."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from .config import OptimConfig
from .dist import all_reduce_max


def no_decay(name: str, p: nn.Parameter) -> bool:
    """Norm weights and biases get no weight decay (everything 1-D is one of those)."""
    return p.dim() < 2 or name.rsplit(".", 1)[-1] == "bias"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """model: a DecoderLM; what its attention variants keep from decay (Diff: the lambdas) joins the no-decay group."""
    decay, plain = [], []
    exempt = {id(p) for p in model.no_decay_parameters()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if no_decay(name, p) or id(p) in exempt else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "group": "decay"},
        {"params": plain, "weight_decay": 0.0, "group": "no_decay"},
    ]


class SkipStepAdamW(torch.optim.AdamW):
    """torch AdamW whose `step` does nothing, on all ranks alike, when any rank sees a non-finite gradient, the
    trainer set `force_skip` (a non-finite loss) or its `gate()` says so (a spike: diffllm/train/spikes.py). Under
    ZeRO, DeepSpeed calls this on every rank with that rank's (clipped, averaged) fp32 gradient partition, once per
    parameter group (or sub-group), after it computed the global grad norm, so the check covers the whole model and
    the gate can read that norm. The trainer clears `force_skip` and `gate` after the engine's step. Adam's moments
    and step count stay untouched by a skipped step."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.force_skip = False
        self.gate: Optional[Callable[[], bool]] = None
        self.skipped = False

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        # one sum per gradient tensor (NaN and inf survive a sum; a finite fp32 gradient does not overflow it)
        bad = self.force_skip or (self.gate is not None and self.gate()) or (
            bool(grads) and not bool(torch.stack([g.sum() for g in grads]).isfinite().all()))
        self.skipped = all_reduce_max(bad)
        if self.skipped:
            return None
        return super().step(closure)


def build_optimizer(model: nn.Module, opt: OptimConfig) -> SkipStepAdamW:
    """fused/foreach are left to torch's defaults; the lr is set by the trainer before every step."""
    return SkipStepAdamW(param_groups(model, opt.weight_decay), lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)
