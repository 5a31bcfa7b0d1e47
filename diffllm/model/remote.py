"""Torch-only layers shared by diffllm's model and its `format=remote` export, where this file ships verbatim as
`diffllm_layers_<h>.py` beside `modeling_diffllm.py` (so it imports nothing but torch).

A variant's remote attention class (`AttentionVariant.remote`) is copied into the export's `diffllm_attention_<h>.py`
with `import torch`, `from torch import nn`, `import torch.nn.functional as F` and `from .diffllm_layers_<h> import *`
above it: it may use those names and the ones below, nothing else. It is built as `cls(config, layer_idx)` (config:
the export's DiffLLMConfig, i.e. ModelConfig's fields plus the variant's `remote_config` keys) and called as
`forward(x (B, T, E), cos, sin (B, T, r/2), mask (B, 1, T, S) bool, cache) -> (B, T, E)`, keys cached after rotary
through `self.cached(k, v, cache)`. Its parameter names must be the diffllm module's, so the weights load as they are.
"""
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "SwiGLU", "build_norm", "rotary_cos_sin", "apply_rotary", "attend", "RemoteAttention"]


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back, as the official Diff code does."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).type_as(x)


class SwiGLU(nn.Module):
    """(swish(x W_G) * x W_1) W_2, no bias."""

    def __init__(self, d_model, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def build_norm(config, dim):
    """The remote model's norm: RMSNorm, or LayerNorm with bias (config.norm)."""
    return RMSNorm(dim, config.norm_eps) if config.norm == "rmsnorm" else nn.LayerNorm(dim, eps=config.norm_eps)


def rotary_cos_sin(positions, rotary_dim, theta):
    """positions (B, T) -> cos, sin (B, T, r/2) in fp32 (per row: left padding shifts positions)."""
    dims = torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / theta ** (dims / rotary_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, r/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin, interleaved):
    """Rotate the first 2*cos.shape[-1] dims of each head. x: (B, T, H, d); cos, sin: (B, T, r/2)."""
    r = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :r].float(), x[..., r:]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, T, 1, r/2)
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2:]
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rotated.type_as(x), x_pass), dim=-1)


def attend(q, k, v, mask):
    """softmax(q k^T / sqrt d + mask) v; query head j reads kv head j // (Hq / Hkv).
    q: (B, Hq, T, d), k: (B, Hkv, S, d), v: (B, Hkv, S, dv), mask: (B, 1, T, S) bool -> (B, Hq, T, dv)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class RemoteAttention(nn.Module):
    """Base of the remote attention classes: q_proj (q_heads heads of d), k_proj (kv_heads of d), v_proj (kv_heads
    of v_dim), out_proj (d_model -> d_model), no out bias; d = d_model / n_heads."""

    def __init__(self, config, layer_idx, q_heads, kv_heads, v_dim):
        super().__init__()
        self.layer_idx, self.d = layer_idx, config.d_model // config.n_heads
        self.interleaved = config.rope_interleaved
        self.q_proj = nn.Linear(config.d_model, q_heads * self.d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.d_model, kv_heads * self.d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.d_model, kv_heads * v_dim, bias=config.qkv_bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def qkv(self, x, cos, sin):
        """q (B, T, Hq, d) and k (B, T, Hkv, d) after rotary, v (B, T, Hkv * v_dim)."""
        B, T, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(B, T, -1, self.d), cos, sin, self.interleaved)
        k = apply_rotary(self.k_proj(x).view(B, T, -1, self.d), cos, sin, self.interleaved)
        return q, k, self.v_proj(x)

    def cached(self, k, v, cache):
        """All keys and values so far (the transformers Cache appends this call's)."""
        return (k, v) if cache is None else cache.update(k, v, self.layer_idx)

    def reset_extra(self):
        """Initialise parameters beyond the Linear and norm layers (HF's _init_weights calls it); none here."""
