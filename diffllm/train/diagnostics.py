"""Diagnostics during training (Diff's lambda, and stability telemetry for every arch), added by DiagnosticsHook to the
records that are logged (metrics.jsonl, W&B, the progress line):

    <key>/<i>, <key>_min     each value the variant reports per layer from its parameters (`report()`; Diff V1:
                             lambda/<i>, lambda_min), read after the step's update, and its min over layers
    <key>/<i>                each forward-side value the variant probes (`probes()`; Diff V2: lambda_mean/<i>, the
                             mean of sigmoid(lambda_proj(x)) over the step's tokens and heads), from the training
                             forward
    attn_rms/<i>             RMS of each block's attention output, sqrt(mean(out^2)), from the training forward
    act_max/<i>              the largest |activation| of each block's output (the residual stream after the block),
                             max over the step's micro-batches and ranks
    attn_logit_max/<i>       the largest |q k^T / sqrt(d)| over the causal positions of every softmax map of layer i
                             (both maps of Diff), recomputed with the variant's `project` from the attention input
                             of the step's first micro-batch, one sequence at a time; max over ranks
    grad_norm/<i>            the L2 norm of block i's gradient (pre-clip, averaged over ranks), before the update

The forward-side values come from forward hooks that are armed only for the steps that will be logged (other steps
pay nothing) and taken off after; they keep the mean (the max for act_max and attn_logit_max) over the step's
micro-batches and ranks. They only count forwards in training mode with autograd on (validation runs in eval mode
under no_grad). Under activation checkpointing the recomputation in backward calls each hook a second time with the
same output, which leaves the mean and the max unchanged. Inside a torch.compile'd block, hooks are not reliably
traced: the forward-side values are then left out (said once). The attention logits are not recomputed under ZeRO-3
(calling the q/k projections outside the module's own forward would disturb ZeRO-3's parameter prefetch): left out
there (said once). The block grad norms are taken at the logged steps only (`keep_grad_norms`, between the last
backward and the update) with DeepSpeed's `safe_get_full_grad`: under ZeRO that gathers each parameter's full
gradient (about one all-reduce of the gradients per logged step). Reading the reports under ZeRO-3 gathers the
attention modules' own parameters (Diff: the few lambda vectors) on every rank (a collective): every rank calls
`collect` at the same steps, as it calls every hook.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, Optional

import torch
from torch import nn

from ..model.documents import causal_mask
from .dist import all_reduce_maxes, all_reduce_sum, world_size
from .hooks import Hook, View
from .metrics import finite_or_none, logged


def rms(t: torch.Tensor) -> torch.Tensor:
    """sqrt(mean(t^2)) in fp32 (a 0-dim tensor, still on t's device: no sync)."""
    return t.detach().float().pow(2).mean().sqrt()


class Diagnostics:
    """Per-layer reports (Diff: lambda) and attention-output RMS of `model` (a DecoderLM: `model.layers[i].attn`).
    `say(msg, error=False)` prints notes and warnings (View.say: rank 0 only)."""

    def __init__(self, model: nn.Module, say: Callable[..., None]):
        self.attns = [block.attn for block in model.layers]
        self.probe_keys = [f"{key}/{i}" for i, a in enumerate(self.attns) for key in a.probes()]
        self.blocks = list(model.layers)
        self.compiled = any(getattr(block, "_compiled_call_impl", None) is not None for block in model.layers)
        self.zero3 = any(hasattr(p, "ds_id") for p in model.parameters())
        self.say = say
        self.warned: set[int] = set()
        self.handles: list = []
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.noted_compiled = self.noted_zero3 = False
        self.maxes: dict[str, float] = {}
        self.grad_norms: dict[str, float] = {}

    # ----- forward-side values (armed for the logged steps only) ----------------------------------------------------
    @property
    def armed(self) -> bool:
        return bool(self.handles)

    def arm(self) -> None:
        """Hook each attention module (and what its variant probes) for the next step's forwards."""
        if self.armed:
            return
        if self.compiled:
            if not self.noted_compiled:
                self.say(
                    "note: attn_rms and the variant's probes (Diff V2: lambda_mean) are not logged: hooks inside "
                    "torch.compile'd blocks "
                    "(trainer.compile=true) are not reliably traced"
                )
                self.noted_compiled = True
            return
        self.sums, self.counts, self.maxes, self.grad_norms = {}, {}, {}, {}
        for i, attn in enumerate(self.attns):
            self.handles.append(attn.register_forward_hook(functools.partial(self._keep, f"attn_rms/{i}", rms)))
            if not self.zero3:
                self.handles.append(
                    attn.register_forward_hook(functools.partial(self._logits, f"attn_logit_max/{i}"), with_kwargs=True)
                )
        for i, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_hook(functools.partial(self._max, f"act_max/{i}")))
        if self.zero3 and not self.noted_zero3:
            self.say(
                "note: attn_logit_max is not logged under ZeRO-3 (recomputing q and k outside the attention "
                "module's forward would disturb ZeRO-3's parameter prefetch)"
            )
            self.noted_zero3 = True
        for i, attn in enumerate(self.attns):
            for key, (module, fn) in attn.probes().items():
                self.handles.append(module.register_forward_hook(functools.partial(self._keep, f"{key}/{i}", fn)))

    def _keep(self, key: str, fn, module: nn.Module, args, out: torch.Tensor) -> None:
        if not self._training(module):
            return
        value = fn(out)
        self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.counts[key] = self.counts.get(key, 0) + 1

    @staticmethod
    def _training(module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled()  # not a validation or evaluation forward

    def _max(self, key: str, module: nn.Module, args, out: torch.Tensor) -> None:
        if self._training(module):
            self.maxes[key] = max(self.maxes.get(key, 0.0), float(out.detach().abs().max()))

    def _logits(self, key: str, module: nn.Module, args, kwargs, out: torch.Tensor) -> None:
        """max |q k^T / sqrt(d)| over the positions each map attends to (causal; within documents when the forward
        had document masks), on the step's first micro-batch (a forward recomputed in backward under activation
        checkpointing finds the key already kept)."""
        if not self._training(module) or key in self.maxes:
            return
        x, cos, sin = (a.detach() for a in args[:3])  # (B, T, E); rotary tables (T, r/2), or (B, T, r/2) per row
        docs = kwargs.get("docs")
        T = x.shape[1]
        causal = causal_mask(T, T, x.device)
        top = 0.0
        with torch.no_grad():
            for b in range(x.shape[0]):  # one sequence at a time: (H, T, T) scores, not (B, H, T, T)
                rows = (cos[b : b + 1], sin[b : b + 1]) if cos.dim() == 3 else (cos, sin)
                seen = causal if docs is None else docs.mask[b, 0]  # (T, T) True = attended
                scores, _ = module.scores(x[b : b + 1], *rows)  # (1, Hq, T, T): every softmax map, fp32
                top = max(top, float(scores.abs()[..., seen].max()))
        self.maxes[key] = top

    @torch.no_grad()
    def keep_grad_norms(self) -> None:
        """Each block's gradient norm, between the step's last backward and its update (armed steps only; every rank
        calls it: under ZeRO, DeepSpeed gathers each parameter's full gradient collectively)."""
        from deepspeed.utils import safe_get_full_grad

        for i, block in enumerate(self.blocks):
            sq = 0.0
            for p in block.parameters():
                g = safe_get_full_grad(p) if p.requires_grad else None
                sq += 0.0 if g is None else float(g.detach().float().pow(2).sum())
            self.grad_norms[f"grad_norm/{i}"] = math.sqrt(sq)

    def disarm(self) -> dict[str, Optional[float]]:
        """Take the hooks off; the mean over the step's micro-batches and ranks of each value they kept (every rank
        takes part: one all-reduce). {} when they were not armed."""
        if not self.armed:
            return {}
        for handle in self.handles:
            handle.remove()
        self.handles = []
        keys = [f"attn_rms/{i}" for i in range(len(self.attns))] + self.probe_keys
        means = [float(self.sums[k]) / self.counts[k] if self.counts.get(k) else math.nan for k in keys]
        totals = all_reduce_sum(means)
        max_keys = sorted(self.maxes)  # the same on every rank: the same hooks saw the same forwards
        tops = all_reduce_maxes([self.maxes[k] for k in max_keys])
        out = {k: finite_or_none(v / world_size()) for k, v in zip(keys, totals)}
        out.update({k: finite_or_none(v) for k, v in zip(max_keys, tops)})
        out.update({k: finite_or_none(v) for k, v in self.grad_norms.items()})
        self.sums, self.counts, self.maxes, self.grad_norms = {}, {}, {}, {}
        return out

    # ----- what each variant reports from its parameters --------------------------------------------------------------
    @torch.no_grad()
    def reports(self) -> list[dict[str, float]]:
        """Each layer's `report()`, from the full parameters (ZeRO-3: its own parameters gathered on every rank)."""
        import deepspeed

        params = [p for a in self.attns for p in a.parameters(recurse=False)]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [a.report() for a in self.attns]

    def report_record(self, step: int) -> dict[str, float]:
        """<key>/<i> and <key>_min of every reported value ({} when no layer reports); warns once per layer whose
        value the variant finds wrong (Diff: a negative lambda)."""
        reports = self.reports()
        rec: dict[str, Optional[float]] = {}
        for key in dict.fromkeys(k for r in reports for k in r):
            values = {i: r[key] for i, r in enumerate(reports) if key in r}
            for i, v in values.items():
                why = self.attns[i].warning(key, v)
                if why and i not in self.warned:
                    self.warned.add(i)
                    self.say(f"warning: layer {i}: {why} at step {step}", error=True)
                rec[f"{key}/{i}"] = finite_or_none(v)
            rec[f"{key}_min"] = min(values.values()) if all(map(math.isfinite, values.values())) else None
        return rec

    def collect(self, step: int) -> dict[str, Optional[float]]:
        """Everything for the record of `step`: the reports (always), the forward-side values (when armed)."""
        return {**self.report_record(step), **self.disarm()}


class DiagnosticsHook(Hook):
    """The diagnostics of every logged step, added to its record: the forward-side hooks are armed for the steps
    whose record is written (foreseen: every log_every steps and the last; a skipped or spiking step gets lambda and
    what was armed), the block grad norms kept before the update. Every rank arms and collects at the same steps."""

    def __init__(self, log_every: int):
        self.log_every = log_every
        self.diag: Optional[Diagnostics] = None

    def arm_for(self, view: View, step: int) -> None:
        """Diagnostics hooks on for the forwards of `step` if its record is written (on every rank alike)."""
        steps = view.budget.steps
        if self.diag is not None and step <= steps and (step % self.log_every == 0 or step == steps):
            self.diag.arm()

    def on_start(self, view: View) -> None:
        self.diag = Diagnostics(view.model().module, view.say)
        self.arm_for(view, view.state.step + 1)

    def on_before_update(self, view: View) -> None:
        if self.diag is not None and self.diag.armed:
            self.diag.keep_grad_norms()

    def on_step_end(self, view: View, record: Mapping) -> Optional[dict]:
        out = self.diag.collect(view.state.step) if logged(record, self.log_every, view.budget.steps) else None
        self.arm_for(view, view.state.step + 1)
        return out
