"""Activation memory per token, measured: one block of the real model runs forward on the meta device in bf16 and
autograd's saved tensors are counted (no data, any size, milliseconds). The block is built with the backend its
variant names for measuring (`meta_backend`): the "meta" kernel of diffllm/model/attention.py keeps what
FlashAttention-2 keeps for backward (q, k, v, out and the fp32 log-sum-exp), because the meta device would otherwise
trace SDPA's math path with its T x T maps; `attn_backend=eager` keeps the real maps."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.config import ModelConfig
from ..model.layers import build_norm, rotary_cos_sin
from ..model.transformer import Block


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes per token of one sequence (multiply by micro_batch * seq_len)."""

    block: float  # everything one block saves for backward
    block_input: float  # what full activation checkpointing keeps per block: its input
    head: float  # final norm + output matmul + fp32 cross-entropy, saved for backward
    logits_transient: float  # bf16 logits + their fp32 and bf16 gradients while the head runs backward


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


def activation_bytes(cfg: ModelConfig, seq_len: int, dtype: torch.dtype = torch.bfloat16) -> ActivationBytes:
    meta = torch.device("meta")
    E, V = cfg.d_model, cfg.padded_vocab_size
    with torch.device(meta):
        block = Block(cfg, depth=cfg.n_layers - 1, backend=cfg.variant.meta_backend(cfg)).to(dtype)
        x = torch.empty(1, seq_len, E, dtype=dtype, requires_grad=True)
        cos, sin = rotary_cos_sin(seq_len, cfg.rotary_dim, cfg.rope_theta, meta)
        norm, head = build_norm(cfg.norm, E, cfg.norm_eps).to(dtype), torch.nn.Linear(E, V, bias=False).to(dtype)
        targets = torch.zeros(seq_len, dtype=torch.long)
    block_bytes = _saved_bytes(lambda: block(x, cos, sin), list(block.parameters()))
    head_bytes = _saved_bytes(
        lambda: F.cross_entropy(head(norm(x)).float().view(-1, V), targets),
        list(norm.parameters()) + list(head.parameters()),
    )
    width = torch.finfo(dtype).bits // 8
    return ActivationBytes(
        block=block_bytes / seq_len,
        block_input=E * width,
        head=head_bytes / seq_len,
        logits_transient=V * (width + 4 + width),
    )
