"""Activation memory, measured: the real model's pieces run on the meta device in bf16 (no data, any size,
milliseconds) and their tensors are counted. One block's saved-for-backward tensors (autograd's saved-tensor hooks);
the loss head (`diffllm.model.loss.head_loss` after the final norm) by the peak of the bytes it holds alive through its
forward and backward, saved tensors and transients alike (a dispatch mode that follows every storage until it is
freed), at one and two sequences, so that a head whose transient does not grow with the batch (a chunked one) counts
itself so; and the full diagnostics' logit recompute (the variant's `scores` of one sequence).

The block is built with the backend its variant names for measuring (`meta_backend`): the "meta" kernel of
diffllm/model/kernels.py (called once per GPU-form call: Diff four) keeps what FlashAttention-2 keeps for backward
(q, k, v, out and the fp32 log-sum-exp), because the meta device would otherwise trace SDPA's math path with its
T x T maps; `attn_backend=eager` keeps the real maps."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..model.config import ModelConfig
from ..model.decoder import Block
from ..model.layers import build_norm, rotary_cos_sin
from ..model.loss import head_loss
from ..model.parametrization import readout_scale


@dataclass(frozen=True)
class ActivationBytes:
    """What the activations of a micro-batch of `mb` sequences of seq_len tokens hold (bytes)."""

    block: float  # per token: everything one block saves for backward
    block_input: float  # per token: what full activation checkpointing keeps per block (its input)
    head_fixed: float  # the loss head's peak through its forward and backward: head_fixed + mb x head_per_sequence
    head_per_sequence: float
    head_saved: float  # per token: what the head saves for backward (saved-tensor hooks), part of its peak

    def head(self, mb: int) -> float:
        return self.head_fixed + mb * self.head_per_sequence


def _saved_bytes(fn, params: list[torch.Tensor]) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves while `fn()` runs (views count once)."""
    skip = {id(p) for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in skip and id(base) not in skip:
            seen.setdefault(id(base), base.numel() * base.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        keep = fn()  # keep outputs alive so ids stay unique while counting
    del keep
    return sum(seen.values())


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages made while it is on and not yet freed, and their peak: each op's outputs are
    followed (a view's storage counts once) until their storage dies. Works on the meta device as on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.storages: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.storages.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if id(storage) not in self.storages:
                    self.storages.add(id(storage))
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._freed, id(storage), storage.nbytes())
        return out


def peak_bytes(fn: Callable[[], object]) -> int:
    """The peak of the bytes `fn()` holds alive (inputs made before it are not counted)."""
    with LiveBytes() as live:
        fn()
    return live.peak


def _head_peak(cfg: ModelConfig, seq_len: int, mb: int, dtype: torch.dtype) -> tuple[int, int]:
    """(peak bytes, saved bytes) of the final norm and head_loss, forward and backward, on `mb` sequences. The
    parameters' gradients are dropped as they arrive (ZeRO moves them into its buckets; the model states count them),
    so each counts only as the transient it is."""
    E, V = cfg.d_model, cfg.padded_vocab_size
    with torch.device("meta"):
        norm, head = build_norm(cfg.norm, E, cfg.norm_eps).to(dtype), torch.nn.Linear(E, V, bias=False).to(dtype)
        x = torch.empty(mb, seq_len, E, dtype=dtype, requires_grad=True)
        targets = torch.zeros(mb, seq_len, dtype=torch.long)
    params = list(norm.parameters()) + list(head.parameters())
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    scale = readout_scale(cfg)

    def step() -> None:
        head_loss(head, norm(x), targets, None, scale, "mean").backward()

    saved = _saved_bytes(lambda: head_loss(head, norm(x), targets, None, scale, "mean"), params)
    return peak_bytes(step), saved


def activation_bytes(cfg: ModelConfig, seq_len: int, dtype: torch.dtype = torch.bfloat16) -> ActivationBytes:
    meta = torch.device("meta")
    E = cfg.d_model
    with torch.device(meta):
        block = Block(cfg, depth=cfg.n_layers - 1, backend=cfg.variant.meta_backend(cfg)).to(dtype)
        x = torch.empty(1, seq_len, E, dtype=dtype, requires_grad=True)
        cos, sin = rotary_cos_sin(seq_len, cfg.rotary_dim, cfg.rope_theta, meta)
    block_bytes = _saved_bytes(lambda: block(x, cos, sin), list(block.parameters()))
    (one, saved), (two, _) = _head_peak(cfg, seq_len, 1, dtype), _head_peak(cfg, seq_len, 2, dtype)
    return ActivationBytes(
        block=block_bytes / seq_len,
        block_input=E * (torch.finfo(dtype).bits // 8),
        head_fixed=float(2 * one - two),
        head_per_sequence=float(two - one),
        head_saved=saved / seq_len,
    )


def logit_recompute_bytes(cfg: ModelConfig, seq_len: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """The full diagnostics' attn_logit_max (train/diagnostics.py) on one sequence: the variant's fp32 `scores` of
    every softmax map and their absolute values (measured), then the causal half picked out of those (half a map's
    bytes more; a boolean index has no meta kernel)."""
    meta = torch.device("meta")
    with torch.device(meta):
        attn = Block(cfg, depth=cfg.n_layers - 1, backend=cfg.variant.meta_backend(cfg)).to(dtype).attn
        x = torch.empty(1, seq_len, cfg.d_model, dtype=dtype)
        cos, sin = rotary_cos_sin(seq_len, cfg.rotary_dim, cfg.rope_theta, meta)
    with torch.no_grad(), LiveBytes() as live:
        scores, _ = attn.scores(x, cos, sin)  # (1, Hq, T, T) fp32
        size = scores.abs().numel() * scores.element_size()  # kept alive to the end of the line, as `.abs()[seen]`
        return float(max(live.peak, live.live + size + size / 2))
