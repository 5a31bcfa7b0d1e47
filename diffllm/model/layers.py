"""The model's layers, torch only: RMSNorm, LayerNorm, rotary embeddings, the SwiGLU MLP, and `AttentionEquations`,
the base of every attention variant's equations. A `format=remote` export ships this file verbatim (as
`diffllm_layers_<h>.py`), so it imports nothing but torch and what it defines is what the exported model runs."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "SwiGLU", "build_norm", "rotary_cos_sin", "apply_rotary", "heads_of", "AttentionEquations"]


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back, as the official Diff code does."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).type_as(x)


class SwiGLU(nn.Module):
    """(swish(x W_G) * x W_1) W_2, no bias."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def build_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """`rmsnorm` (fp32) or `layernorm` (with bias, StableLM's)."""
    return RMSNorm(dim, eps) if kind == "rmsnorm" else nn.LayerNorm(dim, eps=eps, bias=True)


def rotary_cos_sin(
    positions: Union[int, torch.Tensor],
    rotary_dim: int,
    theta: float,
    device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (*positions.shape, rotary_dim/2) in fp32 (fp64 for float64 references); an int n means the
    positions 0..n-1, i.e. (n, r/2). Computed per call (no buffers), so meta init and bf16 casts never touch them."""
    dtype = torch.promote_types(dtype, torch.float32)
    if isinstance(positions, int):
        positions = torch.arange(positions, device=device, dtype=dtype)
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=dtype) / rotary_dim)
    angles = positions.to(dtype)[..., None] * inv_freq  # (..., r/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] dims of each head. x: (B, T, H, d); cos/sin: (T, r/2), or (B, T, r/2) for
    per-row positions (documents restarting at 0 in packed rows, left padding).
    interleaved=True pairs dims (2i, 2i+1) (GPT-J, the official Diff code); False pairs (i, i + r/2) (NeoX, HF)."""
    r = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :r].to(torch.promote_types(x.dtype, cos.dtype)), x[..., r:]
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, r/2)
    else:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, T, 1, r/2)
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rotated.type_as(x), x_pass), dim=-1)


def heads_of(t: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, n * d) -> (B, T, n, d)."""
    B, T, _ = t.shape
    return t.view(B, T, n, -1)


class AttentionEquations(nn.Module):
    """An attention variant's equations, written once: what diffllm's forward, the maps eval rebuilds and the
    exported model all run. Built as `cls(cfg, depth)` from a config with diffllm's field names (`d_model`,
    `n_heads`, `n_kv_heads`, `rope_interleaved`, `qkv_bias`, the variant's own keys): ModelConfig, or the export's
    DiffLLMConfig. A subclass declares

        project(x, cos, sin) -> q (B, Hq, T, d), k (B, Hk, T, d), v (B, Hv, T, dv)   after rotary; k, v are cached
        mix(x, o)            -> (B, H, T, *)   the H output heads from per-query-head o (B, Hq, T, *): linear in o
        finish(x, y)         -> (B, T, E)      the module's output from the mixed heads y (B, H, T, dv)

    and the attention between them is one standard causal call: query head j reads key head j // (Hq/Hk) and the
    values tiled to Hk heads (`kernel_values`: Diff's two key components share one value head). `mix` is linear, so
    it also turns the Hq softmax maps into the H maps that weigh the values (eval reads those; output head i reads
    value head i // (H/Hv)). The default mix, the identity, is the Transformer's."""

    def __init__(self, cfg, depth: int):
        super().__init__()
        self.depth = depth
        self.interleaved = cfg.rope_interleaved

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def mix(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return o

    def finish(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rotated(self, proj: nn.Linear, x: torch.Tensor, n: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """proj(x) as n heads, rotary applied: (B, T, n, d)."""
        return apply_rotary(heads_of(proj(x), n), cos, sin, self.interleaved)

    @staticmethod
    def kernel_values(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The values a standard attention call reads beside k: v itself, or tiled to the keys' head count."""
        return v if v.shape[1] == k.shape[1] else v.repeat(1, k.shape[1] // v.shape[1], 1, 1)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, cache=None
    ) -> torch.Tensor:
        """The exported model's forward (diffllm's own is AttentionVariant's, over its kernels): mask (B, 1, T, S)
        bool, True = attend; `cache` a transformers Cache."""
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.depth)  # (B, H*, S, d*): this call's keys appended
        rep = q.shape[1] // k.shape[1]
        o = F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, dim=1), self.kernel_values(k, v).repeat_interleave(rep, dim=1), attn_mask=mask
        )
        return self.finish(x, self.mix(x, o))
