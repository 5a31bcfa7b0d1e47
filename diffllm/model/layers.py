"""Building blocks of the model: norms, rotary embeddings, the SwiGLU MLP (RMSNorm and SwiGLU are defined in
remote.py, whose torch-only code a format=remote export ships)."""
from __future__ import annotations

import torch
from torch import nn

from .remote import RMSNorm, SwiGLU

__all__ = ["RMSNorm", "SwiGLU", "build_norm", "rotary_cos_sin", "apply_rotary"]


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
    """Rotate the first 2*cos.shape[-1] dims of each head. x: (B, T, H, d); cos/sin: (T, r/2), or (B, T, r/2) for
    per-row positions (documents restarting at 0 in packed rows).
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
