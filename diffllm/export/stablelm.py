"""Our Transformer in StableLM's layout (LayerNorm with bias, partial rotary) <-> Hugging Face `StableLmForCausalLM`.

Exact: `transformer-stablelm-3b` is stabilityai/stablelm-3b-4e1t's shape. Interleaved-rotary runs have the rotated
part of their q/k rows permuted into rotate-half order.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..model import ModelConfig
from .convert import (
    check_config,
    common_config_kwargs,
    common_model_kwargs,
    from_hf_names,
    rotate_half_layout,
    to_hf_names,
    unmet,
)

NAME, HF_CLASS, MODEL_TYPE = "stablelm", "StableLmForCausalLM", "stablelm"


def why_not(cfg: ModelConfig) -> Optional[str]:
    return unmet(
        cfg,
        "StableLM",
        {"arch": ("transformer", "has standard attention"), "norm": ("layernorm", "has LayerNorm with bias")},
    )


def stablelm_config_kwargs(cfg: ModelConfig) -> dict:
    """Keyword arguments for `transformers.StableLmConfig` describing the same network."""
    return dict(
        common_config_kwargs(cfg),
        layer_norm_eps=cfg.norm_eps,
        use_qkv_bias=cfg.qkv_bias,
        qk_layernorm=False,
        use_parallel_residual=False,
        partial_rotary_factor=cfg.rotary_pct,
        hidden_dropout=0.0,
    )


def hf_config(cfg: ModelConfig):
    import transformers

    return transformers.StableLmConfig(**stablelm_config_kwargs(cfg))


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return to_hf_names(rotate_half_layout(sd, cfg))


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    check_config(hf_cfg, {"qk_layernorm": False, "use_parallel_residual": False}, NAME)
    rotary_pct = float(
        (getattr(hf_cfg, "rope_parameters", None) or {}).get(
            "partial_rotary_factor", getattr(hf_cfg, "partial_rotary_factor", 1.0)
        )
    )
    cfg = ModelConfig(
        arch="transformer",
        norm="layernorm",
        norm_eps=hf_cfg.layer_norm_eps,
        rotary_pct=rotary_pct,
        qkv_bias=bool(hf_cfg.use_qkv_bias),
        **common_model_kwargs(hf_cfg, NAME),
    )
    return cfg, from_hf_names(sd)
