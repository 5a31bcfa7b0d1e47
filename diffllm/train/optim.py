"""The optimizer under DeepSpeed: AdamW with decay/no-decay parameter groups (torch's, fused on CUDA; DeepSpeed's CPU
Adam when the optimizer state is offloaded), and a step that is skipped on every rank when its UpdateGate drops the
update (a non-finite loss or gradient, a spike): one decision per step, from values every rank shares."""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ..errors import UserError
from ..model.parametrization import eps_mult, is_mup, lr_mult, treatments, width_mult
from .config import OptimConfig


def no_decay(name: str, p: nn.Parameter) -> bool:
    """Norm weights and biases get no weight decay (everything 1-D is one of those)."""
    return p.dim() < 2 or name.rsplit(".", 1)[-1] == "bias"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """model: a DecoderLM; what its attention variants keep from decay (Diff: the lambdas) joins the no-decay group.
    Under parametrization=mup each group is split by its parameters' lr multiplier (`lr_mult`, which the step
    multiplies the scheduled lr by; a hidden matrix's weight decay times width_mult): at width_mult 1 the groups
    are sp's. Under completep also by AdamW's ε multiplier (`eps_mult`: 1/depth_mult inside the blocks), which
    `with_eps` turns into the group's ε; at depth_mult 1 the groups are mup's."""
    decay, plain = [], []
    exempt = {id(p) for p in model.no_decay_parameters()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if no_decay(name, p) or id(p) in exempt else decay).append((name, p))
    groups = [("decay", decay, weight_decay), ("no_decay", plain, 0.0)]
    if is_mup(model.cfg):
        return [g for label, params, wd in groups for g in mup_groups(model, label, params, wd)]
    return [{"params": [p for _, p in params], "weight_decay": wd, "group": label} for label, params, wd in groups]


def mup_groups(model: nn.Module, label: str, params: list, weight_decay: float) -> list[dict]:
    """One group per lr multiplier, in the order first met: {"params", "weight_decay", "group", "lr_mult"}."""
    kinds, m = treatments(model), width_mult(model.cfg)
    split: dict[tuple[float, float], dict] = {}
    for name, p in params:
        mult, eps = lr_mult(kinds[name], m), eps_mult(name, model.cfg)
        wd = weight_decay * m if kinds[name] == "hidden" else weight_decay  # mup.MuAdamW: lr x wd unchanged
        group = {"params": [], "weight_decay": wd, "group": label, "lr_mult": mult}
        split.setdefault((mult, eps), group | ({"eps_mult": eps} if eps != 1.0 else {}))["params"].append(p)
    return list(split.values()) or [{"params": [], "weight_decay": weight_decay, "group": label, "lr_mult": 1.0}]


def with_eps(groups: list[dict], eps: float) -> list[dict]:
    """The groups with completep's per-group AdamW ε (`eps_mult` x eps) where they carry one."""
    return [g | {"eps": eps * g["eps_mult"]} if "eps_mult" in g else g for g in groups]


class UpdateGate:
    """Whether this step's update is dropped, on every rank alike: the step's one decision, which crosses into
    DeepSpeed's optimizer step through the optimizer it was built with (`GatedStep`). Per step:

        gate.arm(force, norm, judge)   # before engine.step(): `force` drops it (a non-finite loss or, where the
        engine.step()                  #   norm was agreed before, gradient); decided at the optimizer's first call
        skipped = gate.disarm()        # whether the optimizer dropped the update

    The decision, made once per step when DeepSpeed first calls the optimizer (after it computed the global grad
    norm, before any update; it then calls it once per parameter group, which gets the same answer): drop when
    `force`, when `norm()` (the step's pre-clip global grad norm, the same on every rank) is not a finite number
    >= 0 (inf/NaN whenever any gradient is), or when `judge()` (a spike test) says so. Every input is one that
    every rank shares, so every rank decides alike without a collective.

    `closed()`: every update in the block is dropped (DeepSpeed's bf16 initialisation step)."""

    def __init__(self) -> None:
        self.force = False
        self.norm: Callable[[], Optional[float]] = lambda: None
        self.judge: Optional[Callable[[], bool]] = None
        self.decision: Optional[bool] = None
        self.skipped = False

    def arm(
        self,
        force: bool,
        norm: Callable[[], Optional[float]] = lambda: None,
        judge: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.force, self.norm, self.judge, self.decision, self.skipped = force, norm, judge, None, False

    def drops(self) -> bool:
        """The step's decision (made at the first call, then kept)."""
        if self.decision is None:
            norm = None if self.force else self.norm()
            invalid = norm is not None and not 0.0 <= norm < math.inf  # NaN fails both comparisons
            self.decision = self.force or invalid or (self.judge is not None and self.judge())
        return self.decision

    def disarm(self) -> bool:
        skipped = self.skipped
        self.force, self.norm, self.judge, self.decision = False, lambda: None, None, None
        return skipped

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        self.force, self.decision = True, None
        try:
            yield
        finally:
            self.force, self.decision = False, None


class GatedStep:
    """An optimizer (mixed in before it) whose `step` does nothing when its `gate` (UpdateGate) drops the update: a
    non-finite loss or gradient, a spike (diffllm/train/spikes.py). Under ZeRO, DeepSpeed calls it on every rank with
    that rank's (clipped, averaged) fp32 partition, once per parameter group (or sub-group), after it computed the
    global grad norm. The moments and step count stay untouched by a skipped step."""

    def __init__(self, params, gate: Optional[UpdateGate] = None, **kwargs):
        super().__init__(params, **kwargs)
        self.gate = gate or UpdateGate()

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        self.gate.skipped = self.gate.drops()
        if self.gate.skipped:
            return None
        return super().step(closure, **kwargs)


class SkipStepAdamW(GatedStep, torch.optim.AdamW):
    """torch AdamW (fused=True on CUDA: one kernel for all tensors, the step count kept on the device) behind the
    gate."""


def cpu_adam(gate: UpdateGate, groups: list[dict], **kwargs) -> torch.optim.Optimizer:
    """DeepSpeed's CPU Adam (AdamW mode: a vectorised C++ op, JIT-built on first use with ninja and a C++ compiler)
    behind the gate, for trainer.offload_optimizer: the update runs on the host where the fp32 partition lives."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    class SkipStepCPUAdam(GatedStep, DeepSpeedCPUAdam):
        pass

    try:
        return SkipStepCPUAdam(groups, gate, adamw_mode=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - a failed JIT build raises whatever the compiler chain raises
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"trainer.offload_optimizer: DeepSpeed's CPU Adam op could not be built or loaded ({why}); it JIT-builds "
            "on first use with ninja and a C++ compiler (then it is cached in ~/.cache/torch_extensions)"
        ) from None


def build_optimizer(
    model: nn.Module, opt: OptimConfig, gate: UpdateGate, cuda: bool = False, offload: bool = False
) -> torch.optim.Optimizer:
    """The optimizer under DeepSpeed, behind `gate`: DeepSpeed's CPU Adam when the optimizer state is offloaded to the
    host (offload: trainer.offload_optimizer), else torch AdamW, fused when the parameters train on CUDA (`cuda`;
    DeepSpeed moves them there after this), elsewhere torch's default kernels (whose numbers the golden files hold).
    The lr is set by the trainer before every step."""
    groups = with_eps(param_groups(model, opt.weight_decay), opt.eps)
    hyper = dict(lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)
    if offload:
        return cpu_adam(gate, groups, **hyper)
    return SkipStepAdamW(groups, gate, fused=True if cuda else None, **hyper)
