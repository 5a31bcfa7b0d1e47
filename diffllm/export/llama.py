"""Our Transformer in the paper's layout (RMSNorm, SwiGLU, full rotary) <-> Hugging Face `LlamaForCausalLM`.

Exact: the same modules in the same order. Interleaved-rotary runs have their q/k rows permuted inside each head into
rotate-half order; qkv_bias maps to `attention_bias`, whose extra o_proj bias is written as zeros.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..model import ModelConfig
from .convert import (
    add_zero_o_bias,
    check_config,
    common_config_kwargs,
    common_model_kwargs,
    drop_zero_o_bias,
    from_hf_names,
    rotate_half_layout,
    to_hf_names,
    unmet,
)

NAME, HF_CLASS, MODEL_TYPE = "llama", "LlamaForCausalLM", "llama"


def why_not(cfg: ModelConfig) -> Optional[str]:
    """None if Llama represents `cfg` exactly, else why not."""
    return unmet(
        cfg,
        "Llama",
        {
            "arch": ("transformer", "has standard attention"),
            "norm": ("rmsnorm", "has RMSNorm"),
            "rotary_pct": (1.0, "rotates the whole head"),
        },
    )


def hf_config(cfg: ModelConfig):
    import transformers

    return transformers.LlamaConfig(
        **common_config_kwargs(cfg),
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.norm_eps,
        attention_bias=cfg.qkv_bias,
        mlp_bias=False,
    )


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return add_zero_o_bias(to_hf_names(rotate_half_layout(sd, cfg)), cfg)


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    check_config(hf_cfg, {"mlp_bias": False}, NAME)
    cfg = ModelConfig(
        arch="transformer",
        norm="rmsnorm",
        norm_eps=hf_cfg.rms_norm_eps,
        qkv_bias=bool(hf_cfg.attention_bias),
        **common_model_kwargs(hf_cfg, NAME),
    )
    return cfg, from_hf_names(drop_zero_o_bias(sd, NAME))
