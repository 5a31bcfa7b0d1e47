"""Diagnostics during training (Diff's lambda, and stability telemetry for every arch), added by the diagnostics hook
to the records that are logged (metrics.jsonl, W&B, the progress line), at the level `trainer.diagnostics` asks:

    off    nothing (no hook: a logged step costs what a plain step costs)
    cheap  what costs no host sync per layer and one collective per logged step (CheapDiagnostics): per-block
           gradient and weight norms from each rank's local fp32 partition, the forward-side values below kept on
           the device, attn_logit_max on a sample, the reports; everything reduced in one all-gather and read back once
    full   all of the below, as they were first measured (the stability study's telemetry): each parameter's full
           gradient gathered, a value read back per layer and micro-batch

What a logged step records:

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
                             of the step's first micro-batch, one sequence at a time; max over ranks. cheap samples
                             it: the first sequence's first LOGIT_SAMPLE positions (exact for those positions: causal
                             logits of a prefix do not depend on what follows)
    grad_norm/<i>            the L2 norm of block i's gradient (pre-clip, averaged over ranks), before the update
    weight_norm/<i>          cheap only: the L2 norm of block i's fp32 weights after the update

The forward-side values come from forward hooks that are armed only for the steps that will be logged (other steps
pay nothing) and taken off after; they keep the mean (the max for act_max and attn_logit_max) over the step's
micro-batches and ranks. They only count forwards in training mode with autograd on (validation runs in eval mode
under no_grad). Under activation checkpointing the recomputation in backward calls each hook a second time with the
same output, which leaves the mean and the max unchanged. Inside a torch.compile'd model or block, hooks are not
reliably traced: the forward-side values are then left out (said once). The attention logits are not recomputed under
ZeRO-3 (calling the q/k projections outside the module's own forward would disturb ZeRO-3's parameter prefetch): left
out there (said once). At full, the block grad norms are taken at the logged steps only (`keep_grad_norms`, between
the last backward and the update) with DeepSpeed's `safe_get_full_grad`: under ZeRO that gathers each parameter's full
gradient (about one all-reduce of the gradients per logged step), and reading the reports under ZeRO-3 gathers the
attention modules' own parameters (Diff: the few lambda vectors) on every rank (a collective). At cheap, the norms are
sums of squares over each rank's own piece (`Pieces`: ZeRO-1/2's fp32 fragments, ZeRO-3's local partitions, the
whole replicated tensor without ZeRO) and the reports are computed on the host from the attention modules' own
parameters read back with the rest (under ZeRO-3, from their fp32 partitions gathered in the same all-gather). Every
rank calls `collect` at the same steps, as it calls every hook.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import nn

from ..model.documents import causal_mask
from .dist import all_gather_into, all_reduce_maxes, all_reduce_sum, world_size
from .hooks import Hook, View
from .metrics import finite_or_none, logged

LOGIT_SAMPLE = 512  # cheap: attn_logit_max from the first sequence's first this many positions


def rms(t: torch.Tensor) -> torch.Tensor:
    """sqrt(mean(t^2)) in fp32 (a 0-dim tensor, still on t's device: no sync)."""
    return t.detach().float().pow(2).mean().sqrt()


def compiled(module: nn.Module) -> bool:
    """Whether `module.compile()` (torch.compile in place) was called on it."""
    return getattr(module, "_compiled_call_impl", None) is not None


class Diagnostics:
    """Per-layer reports (Diff: lambda) and attention-output RMS of `model` (a DecoderLM: `model.layers[i].attn`).
    `say(msg, error=False)` prints notes and warnings (View.say: rank 0 only)."""

    def __init__(self, model: nn.Module, say: Callable[..., None]):
        self.attns = [block.attn for block in model.layers]
        self.probe_keys = [f"{key}/{i}" for i, a in enumerate(self.attns) for key in a.probes()]
        self.blocks = list(model.layers)
        self.compiled = any(compiled(m) for m in (model, *model.layers))  # the whole model or its blocks
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

    def report_record(self, step: int, reports: Optional[list[dict[str, float]]] = None) -> dict[str, float]:
        """<key>/<i> and <key>_min of every reported value (`reports`, default: `reports()`; {} when no layer
        reports); warns once per layer whose value the variant finds wrong (Diff: a negative lambda)."""
        reports = self.reports() if reports is None else reports
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

    def wants_grads(self) -> bool:
        """Whether this step's block grad norms are kept before the update (full: with the forward hooks)."""
        return self.armed


class Pieces:
    """Each rank's own piece of the model's parameters, as DeepSpeed holds them: under ZeRO-3 the local fp32 partition
    (deepspeed.utils.safe_get_local_fp32_param / safe_get_local_grad), under ZeRO-1/2 the fp32 fragment DeepSpeed
    links to each parameter (its `_hp_mapping`: the fragment of this rank's flat fp32 partition, and of the averaged
    gradient), without ZeRO the whole tensor, the same on every rank (`replicated`; the fp32 master where DeepSpeed
    keeps one). Sums of squares of the pieces add up over ranks to the whole tensor's. `optimizer`: DeepSpeed's (the
    engine's), whose fp32 masters a bf16 run without ZeRO keeps."""

    def __init__(self, model: nn.Module, optimizer=None):
        params = [p for p in model.parameters() if p.requires_grad]
        self.zero3 = any(hasattr(p, "ds_id") for p in params)
        self.replicated = not self.zero3 and not any(hasattr(p, "_hp_mapping") for p in params)
        lp, hp = getattr(optimizer, "fp16_groups", None), getattr(optimizer, "fp32_groups", None)
        pairs = zip((p for g in lp for p in g), (q for g in hp for q in g)) if lp and hp else ()
        self.master = {id(p): q for p, q in pairs}
        self.device = params[0].device if params else torch.device("cpu")

    def grad(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        """This rank's piece of p's averaged gradient (between the last backward and the update), flat."""
        if self.zero3:
            from deepspeed.utils import safe_get_local_grad

            return safe_get_local_grad(p)
        if self.replicated:
            return p.grad
        m = getattr(p, "_hp_mapping", None)
        if m is None:
            return None
        g = m.get_lp_grad_fragment(p._index_in_param_group).flatten()
        a = m.lp_fragment_address  # a full accumulation buffer (bf16 at ZeRO-1): this rank's fragment of it
        return g.narrow(0, a.start, a.numel) if g.numel() == p.numel() else g

    def weight(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        """This rank's piece of p's fp32 weights, flat."""
        if self.zero3:
            from deepspeed.utils import safe_get_local_fp32_param

            return safe_get_local_fp32_param(p)
        if self.replicated:
            return self.master.get(id(p), p).detach()
        m = getattr(p, "_hp_mapping", None)
        return None if m is None else m.get_hp_fragment()

    def squares(self, blocks: Sequence[nn.Module], piece: Callable) -> torch.Tensor:
        """(len(blocks),) float64 on the device: each block's sum of squares over this rank's pieces."""
        zero = torch.zeros(1, dtype=torch.float64, device=self.device)
        out = []
        for block in blocks:
            pieces = [piece(p) for p in block.parameters() if p.requires_grad]
            sq = [self.here(t.detach().float().pow(2).sum()).double() for t in pieces if t is not None]
            out.append(torch.stack([*sq, zero[0]]).sum())
        return torch.stack(out) if out else zero[:0]

    def here(self, t: torch.Tensor) -> torch.Tensor:
        """t on the collective's device; a host value (offloaded optimizer) through pinned memory, without waiting."""
        if t.device == self.device:
            return t
        return (t.pin_memory() if self.device.type == "cuda" else t).to(self.device, non_blocking=True)

    def own(self, attns: Sequence[nn.Module]) -> tuple[torch.Tensor, list[tuple[nn.Module, str, nn.Parameter, int]]]:
        """The attention modules' own parameters (what `report()` reads: Diff's lambda vectors) as one float64 flat
        of this rank's pieces (ZeRO-3: its fp32 partitions; else the whole tensors), and what each stretch is."""
        flat, where = [], []
        for a in attns:
            for name, p in a.named_parameters(recurse=False):
                piece = self.weight(p) if self.zero3 else p.detach().flatten()
                flat.append(self.here(piece.double()))
                where.append((a, name, p, piece.numel()))
        values = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64, device=self.device)
        return values, where

    def whole(self, gathered: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
        """p's tensor from the pieces every rank gave (gathered: (world_size, piece)), on the same device."""
        if not self.zero3:
            return gathered[0].view(p.shape)
        return gathered.flatten()[: p.ds_numel].view(p.ds_shape)


class _Report(nn.Module):
    """An attention module's `report()` as a forward, for torch.func.functional_call with other parameter values."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn

    def forward(self) -> dict[str, float]:
        return self.attn.report()


class CheapDiagnostics(Diagnostics):
    """trainer.diagnostics=cheap: the forward-side values kept on the device (no host sync per layer or micro-batch),
    attn_logit_max sampled (the first LOGIT_SAMPLE positions of the step's first sequence), per-block gradient norms
    (before the update) and weight norms (after it) from each rank's own pieces (`Pieces`), the reports from the
    attention modules' own parameters; everything in one all-gather and one readback per logged step."""

    def __init__(self, model: nn.Module, say: Callable[..., None], optimizer=None):
        super().__init__(model, say)
        self.pieces = Pieces(model, optimizer)
        self.due = False
        self.grad_sq: Optional[torch.Tensor] = None

    def arm(self) -> None:
        self.due, self.grad_sq = True, None
        super().arm()

    def wants_grads(self) -> bool:
        return self.due

    def _max(self, key: str, module: nn.Module, args, out: torch.Tensor) -> None:
        if self._training(module):
            top = out.detach().abs().amax().float()
            self.maxes[key] = torch.maximum(self.maxes[key], top) if key in self.maxes else top

    def _logits(self, key: str, module: nn.Module, args, kwargs, out: torch.Tensor) -> None:
        if not self._training(module) or key in self.maxes:
            return
        x, cos, sin = (a.detach() for a in args[:3])  # (B, T, E); rotary tables (T, r/2), or (B, T, r/2) per row
        S, docs = min(x.shape[1], LOGIT_SAMPLE), kwargs.get("docs")
        rows = (cos[:1, :S], sin[:1, :S]) if cos.dim() == 3 else (cos[:S], sin[:S])
        seen = causal_mask(S, S, x.device) if docs is None else docs.mask[0, 0, :S, :S]  # (S, S) True = attended
        with torch.no_grad():
            scores, _ = module.scores(x[:1, :S], *rows)  # (1, Hq, S, S): every softmax map, fp32
            self.maxes[key] = scores.abs().masked_fill(~seen, 0.0).amax()

    @torch.no_grad()
    def keep_grad_norms(self) -> None:
        """This rank's sum of squares of each block's gradient pieces (on the device, reduced at collect)."""
        self.grad_sq = self.pieces.squares(self.blocks, self.pieces.grad)

    @torch.no_grad()
    def collect(self, step: int) -> dict[str, Optional[float]]:
        """The record's values: one all-gather of this rank's [means, grad squares, weight squares, maxes, own
        parameters], reduced on the device, one readback; the reports computed on the host from it."""
        hooked = self.armed
        for handle in self.handles:
            handle.remove()
        self.handles = []
        dev, n = self.pieces.device, len(self.blocks)
        mean_keys = [f"attn_rms/{i}" for i in range(len(self.attns))] + self.probe_keys if hooked else []
        nan = torch.full((), math.nan, dtype=torch.float64, device=dev)
        means = [self.sums[k].double() / self.counts[k] if self.counts.get(k) else nan for k in mean_keys]
        max_keys = sorted(self.maxes)  # the same on every rank: the same hooks saw the same forwards
        grads = self.grad_sq if self.grad_sq is not None else torch.zeros(0, dtype=torch.float64, device=dev)
        own, where = self.pieces.own(self.attns)
        parts = [
            torch.stack(means) if means else grads[:0],
            grads,
            self.pieces.squares(self.blocks, self.pieces.weight),
            torch.stack([self.maxes[k].double() for k in max_keys]) if max_keys else grads[:0],
            own,
        ]
        sizes = [len(t) for t in parts]
        every = all_gather_into(torch.cat(parts)).split(sizes, dim=1)  # (world_size, size) each
        sums = lambda t: t[0] if self.pieces.replicated else t.sum(0)  # noqa: E731 - replicated: one rank's is all
        reduced = [every[0].sum(0) / world_size(), sums(every[1]).sqrt(), sums(every[2]).sqrt(), every[3].amax(0)]
        out = torch.cat([*reduced, every[4].flatten()]).cpu()  # the readback
        split = sum(len(t) for t in reduced)  # then the own parameters, (world_size, pieces) flattened
        values = iter(out[:split].tolist())
        rec = {k: finite_or_none(next(values)) for k in mean_keys}
        rec.update({f"grad_norm/{i}": finite_or_none(next(values)) for i in range(n) if grads.numel()})
        rec.update({f"weight_norm/{i}": finite_or_none(next(values)) for i in range(n)})
        rec.update({k: finite_or_none(next(values)) for k in max_keys})
        rec = {**self.report_record(step, self.host_reports(out[split:].view(len(every[4]), -1), where)), **rec}
        self.sums, self.counts, self.maxes, self.grad_sq, self.due = {}, {}, {}, None, False
        return rec

    def host_reports(self, host: torch.Tensor, where: list) -> list[dict[str, float]]:
        """Each attention module's `report()` computed on the host from its own parameters read back (host:
        (world_size, pieces), on the host)."""
        values: dict[int, dict[str, torch.Tensor]] = {id(a): {} for a in self.attns}
        start = 0
        for a, name, p, size in where:
            whole = self.pieces.whole(host[:, start : start + size], p)
            values[id(a)][f"attn.{name}"] = whole.to(torch.float32 if self.pieces.zero3 else p.dtype)
            start += size
        return [torch.func.functional_call(_Report(a), values[id(a)], ()) for a in self.attns]


class DiagnosticsHook(Hook):
    """The diagnostics of every logged step at `level` (cheap | full), added to its record: the forward-side hooks are
    armed for the steps whose record is written (foreseen: every log_every steps and the last; a skipped or spiking
    step gets lambda and what was armed), the block grad norms kept before the update. Every rank arms and collects at
    the same steps."""

    def __init__(self, log_every: int, level: str = "full"):
        self.log_every, self.level = log_every, level
        self.diag: Optional[Diagnostics] = None

    def arm_for(self, view: View, step: int) -> None:
        """Diagnostics hooks on for the forwards of `step` if its record is written (on every rank alike)."""
        steps = view.budget.steps
        if self.diag is not None and step <= steps and (step % self.log_every == 0 or step == steps):
            self.diag.arm()

    def on_start(self, view: View) -> None:
        engine = view.model()
        if self.level == "cheap":
            self.diag = CheapDiagnostics(engine.module, view.say, getattr(engine, "optimizer", None))
        else:
            self.diag = Diagnostics(engine.module, view.say)
        self.arm_for(view, view.state.step + 1)

    def on_before_update(self, view: View) -> None:
        if self.diag is not None and self.diag.wants_grads():
            self.diag.keep_grad_norms()

    def on_step_end(self, view: View, record: Mapping) -> Optional[dict]:
        out = self.diag.collect(view.state.step) if logged(record, self.log_every, view.budget.steps) else None
        self.arm_for(view, view.state.step + 1)
        return out


def diagnostics_hooks(level: str, log_every: int) -> list[Hook]:
    """trainer.diagnostics: [] at off, else the hook at its level."""
    return [] if level == "off" else [DiagnosticsHook(log_every, level)]
