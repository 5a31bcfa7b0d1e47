"""Attention maps and logits rebuilt in fp32 from each attention module's own projections, whatever kernel the model
runs (sdpa/flash never materialise them). Forward pre-hooks capture each attention module's input (x, cos, sin);
q and k come from that module's q_proj/k_proj and rotary; nothing of the model is patched.

One small function per architecture turns a module's input into its query/key components:
    transformer  [(q, k)]                       softmax(q k^T / sqrt d) is the map
    diff         [(q1, k1), (q2, k2)], lambda   the map is the differential A1 - lambda A2, divided by (1 - lambda)
                                                so that every row sums to 1 as a softmax row does (our choice; the
                                                paper does not say how it normalises)
    diff2        [(q even, k), (q odd, k)],     query heads 2i and 2i+1 (sharing kv head 2i // (2h/g)); lambda =
                 lambda per token and head      sigmoid(lambda_proj(x)) per query token, normalised the same way
Adding an architecture = one entry in QK and one in OUTPUT.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch

from ..model.layers import apply_rotary

Scores = Callable[[torch.Tensor], torch.Tensor]  # a transform of masked-out-free logits (B, H, T, T), e.g. quantise


def _heads(t: torch.Tensor, n: int, d: int) -> torch.Tensor:
    B, T, _ = t.shape
    return t.view(B, T, n, d)


def qk_transformer(attn, x, cos, sin) -> tuple[list, Optional[torch.Tensor]]:
    """[(q (B, H, T, d), k (B, H, T, d))] in fp32, kv heads repeated to the query heads."""
    q = apply_rotary(_heads(attn.q_proj(x), attn.n_heads, attn.head_dim), cos, sin, attn.interleaved)
    k = apply_rotary(_heads(attn.k_proj(x), attn.n_kv_heads, attn.head_dim), cos, sin, attn.interleaved)
    rep = attn.n_heads // attn.n_kv_heads
    return [(q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(rep, dim=1))], None


def qk_diff(attn, x, cos, sin) -> tuple[list, Optional[torch.Tensor]]:
    """[(q1, k1), (q2, k2)], each (B, h, T, d) in fp32 (diff head i: sub-heads 2i, 2i+1; kv group i // (h/g)), and
    the layer's lambda."""
    h, g, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = apply_rotary(_heads(attn.q_proj(x), 2 * h, d), cos, sin, attn.interleaved)  # (B, T, 2h, d)
    k = apply_rotary(_heads(attn.k_proj(x), 2 * g, d), cos, sin, attn.interleaved)  # (B, T, 2g, d)
    B, T = x.shape[:2]
    q, k = q.view(B, T, h, 2, d), k.view(B, T, g, 2, d)
    pairs = [(q[:, :, :, c].transpose(1, 2).float(), k[:, :, :, c].transpose(1, 2).float().repeat_interleave(h // g, 1))
             for c in (0, 1)]
    return pairs, attn.lambda_full().detach().float()


def qk_diff2(attn, x, cos, sin) -> tuple[list, Optional[torch.Tensor]]:
    """[(q of heads 0, 2, .., k), (q of heads 1, 3, .., k)], each (B, h, T, d) in fp32 (query head j reads kv head
    j // (2h/g)), and lambda = sigmoid(lambda_proj(x)) as (B, h, T, 1): one per head and query token."""
    h, g, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = apply_rotary(_heads(attn.q_proj(x), 2 * h, d), cos, sin, attn.interleaved).transpose(1, 2).float()
    k = apply_rotary(_heads(attn.k_proj(x), g, d), cos, sin, attn.interleaved).transpose(1, 2).float()
    k = k.repeat_interleave(2 * h // g, dim=1)  # (B, 2h, T, d): query head j's keys
    lam = torch.sigmoid(attn.lambda_proj(x).float()).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1)
    return [(q[:, 0::2], k[:, 0::2]), (q[:, 1::2], k[:, 1::2])], lam.detach()


QK = {"transformer": qk_transformer, "diff": qk_diff, "diff2": qk_diff2}


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q k^T / sqrt d: (B, H, T, T) in fp32 (the causal upper triangle is left as computed)."""
    return q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5


def causal_mask(T: int, device=None) -> torch.Tensor:
    """True where a query may look (key index <= query index)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def softmax_map(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    return scores.masked_fill(~causal_mask(T, scores.device), float("-inf")).softmax(-1)


def attention_map(arch: str, attn, x, cos, sin, transform: Optional[Scores] = None) -> torch.Tensor:
    """The (normalised) attention map (B, heads, T, T) in fp32: softmax, or (A1 - lambda A2) / (1 - lambda)."""
    pairs, lam = QK[arch](attn, x, cos, sin)
    maps = [softmax_map(transform(logits(q, k)) if transform else logits(q, k)) for q, k in pairs]
    return maps[0] if lam is None else (maps[0] - lam * maps[1]) / (1 - lam)


def output_transformer(attn, x, cos, sin, transform: Optional[Scores]) -> torch.Tensor:
    B, T, E = x.shape
    probs = attention_map("transformer", attn, x, cos, sin, transform)  # (B, H, T, T)
    v = attn.v_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2).float()
    y = probs @ v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # (B, H, T, d)
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))


def output_diff(attn, x, cos, sin, transform: Optional[Scores]) -> torch.Tensor:
    B, T, E = x.shape
    pairs, lam = qk_diff(attn, x, cos, sin)
    a1, a2 = (softmax_map(transform(logits(q, k)) if transform else logits(q, k)) for q, k in pairs)
    v = attn.v_proj(x).view(B, T, attn.n_kv_heads, 2 * attn.head_dim).transpose(1, 2).float()  # (B, g, T, 2d)
    y = (a1 - lam * a2) @ v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # (B, h, T, 2d)
    y = attn.subln(y) * (1.0 - attn.lambda_init)
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))


def output_diff2(attn, x, cos, sin, transform: Optional[Scores]) -> torch.Tensor:
    B, T, E = x.shape
    pairs, lam = qk_diff2(attn, x, cos, sin)
    a_even, a_odd = (softmax_map(transform(logits(q, k)) if transform else logits(q, k)) for q, k in pairs)
    v = attn.v_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2).float()  # (B, g, T, d)
    v = v.repeat_interleave(2 * attn.n_heads // attn.n_kv_heads, dim=1)[:, 0::2]  # pair i's kv head: (B, h, T, d)
    y = (a_even - lam * a_odd) @ v  # (B, h, T, d)
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))


OUTPUT = {"transformer": output_transformer, "diff": output_diff, "diff2": output_diff2}


def attention_modules(model) -> list:
    return [layer.attn for layer in model.layers]


@contextmanager
def capture(model) -> Iterator[dict]:
    """{"inputs": [(x, cos, sin) per layer], "hidden": [block output per layer]} of the next forward."""
    got: dict = {"inputs": [], "hidden": []}
    hooks = [a.register_forward_pre_hook(lambda m, args: got["inputs"].append(args[:3])) for a in attention_modules(model)]
    hooks += [layer.register_forward_hook(lambda m, args, out: got["hidden"].append(out)) for layer in model.layers]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


@contextmanager
def scores_transformed(model, transform: Optional[Scores]) -> Iterator[None]:
    """Within the block, every attention module's output is recomputed in eager fp32 from its own input with
    `transform` applied to its logits (e.g. quantisation); transform=None reproduces the module's output."""
    arch = model.cfg.arch
    if arch not in OUTPUT:
        raise ValueError(f"arch={arch!r}: attention maps are not implemented for it (known: {', '.join(OUTPUT)})")
    hooks = [a.register_forward_hook(lambda m, args, out: OUTPUT[arch](m, *args[:3], transform))
             for a in attention_modules(model)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
