"""Building blocks shared by both models: norms, rotary embeddings, the SwiGLU MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def build_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    return nn.LayerNorm(dim, eps=eps, bias=True)


def rotary_cos_sin(
    seq_len: int, rotary_dim: int, theta: float, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, rotary_dim/2) in fp32 (fp64 for float64 references). Computed per call (no buffers),
    so meta init and bf16 casts of the module never touch the frequencies."""
    dtype = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, device=device, dtype=dtype) / rotary_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=dtype), inv_freq)  # (T, r/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] dims of each head. x: (B, T, H, d); cos/sin: (T, r/2).
    interleaved=True pairs dims (2i, 2i+1) (GPT-J, the official Diff code); False pairs (i, i + r/2) (NeoX, HF)."""
    r = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :r].to(torch.promote_types(x.dtype, cos.dtype)), x[..., r:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, r/2)
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rotated.type_as(x), x_pass), dim=-1)


class SwiGLU(nn.Module):
    """(swish(x W_G) * x W_1) W_2, no bias."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
