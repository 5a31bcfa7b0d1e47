"""Causal attention kernels (eager | sdpa | flash) and the standard multi-head / grouped-query attention module."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import apply_rotary

try:  # flash-attn is an optional GPU extra; it cannot be built on CPU machines.
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


def flash_available() -> bool:
    return flash_attn_func is not None and torch.cuda.is_available()


def causal_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Materialised causal attention maps, softmax in fp32.
    q: (B, Hq, T, d), k: (B, Hkv, T, d) -> (B, Hq, T, T); query head h reads kv head h // (Hq/Hkv)."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)  # (B, Hq, T, d)
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for float64 references
    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, Hq, T, T)
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(dim=-1).type_as(q)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal) v with GQA (query head h reads kv head h // (Hq/Hkv)).
    q, k: (B, H*, T, d); v: (B, Hkv, T, dv) with dv free to differ from d -> (B, Hq, T, dv)."""
    n_rep = q.shape[1] // k.shape[1]
    if backend == "eager":
        return causal_probs(q, k) @ v.repeat_interleave(n_rep, dim=1)
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
    if backend == "flash":
        if not flash_available():
            raise RuntimeError("attn_backend=flash needs flash-attn and a CUDA device; use attn_backend=sdpa here")
        # flash-attn wants (B, T, H, d) and one head dim for q, k and v: split a wider v into d-sized slices.
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        outs = [flash_attn_func(qt, kt, vs.transpose(1, 2), causal=True) for vs in v.split(q.shape[-1], dim=-1)]
        return torch.cat(outs, dim=-1).transpose(1, 2)
    raise ValueError(f"unknown attention backend {backend!r}")


class Attention(nn.Module):
    """Standard causal self-attention: n_heads query heads and n_kv_heads kv heads of dim d = d_model / n_heads."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.backend, self.interleaved = cfg.attn_backend, cfg.rope_interleaved
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, d)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, d)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, d)
        q, k = apply_rotary(q, cos, sin, self.interleaved), apply_rotary(k, cos, sin, self.interleaved)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.backend)  # (B, H, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))
