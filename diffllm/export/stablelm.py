"""Our Transformer <-> Hugging Face `StableLmForCausalLM`: config and weight-name conversion (used by tests and export)."""
from __future__ import annotations

import re

import torch

from ..model import ModelConfig

# (ours, HF) name patterns; {i} is the layer index.
_LAYER_NAMES = [
    ("attn_norm", "input_layernorm"),
    ("attn.q_proj", "self_attn.q_proj"),
    ("attn.k_proj", "self_attn.k_proj"),
    ("attn.v_proj", "self_attn.v_proj"),
    ("attn.out_proj", "self_attn.o_proj"),
    ("mlp_norm", "post_attention_layernorm"),
    ("mlp.gate_proj", "mlp.gate_proj"),
    ("mlp.up_proj", "mlp.up_proj"),
    ("mlp.down_proj", "mlp.down_proj"),
]
_TOP_NAMES = [("tok_embeddings", "model.embed_tokens"), ("norm", "model.norm"), ("lm_head", "lm_head")]


def _check_exportable(cfg: ModelConfig) -> None:
    problems = {
        "arch": cfg.arch != "transformer",
        "norm": cfg.norm != "layernorm",
        "rope_interleaved": cfg.rope_interleaved,
    }
    bad = [k for k, v in problems.items() if v]
    if bad:
        raise ValueError(f"model.{bad[0]}: StableLM format needs arch=transformer, norm=layernorm, rope_interleaved=false")


def stablelm_config_kwargs(cfg: ModelConfig) -> dict:
    """Keyword arguments for `transformers.StableLmConfig` describing the same network."""
    _check_exportable(cfg)
    return dict(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        hidden_act="silu", max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
        layer_norm_eps=cfg.norm_eps, use_qkv_bias=cfg.qkv_bias, qk_layernorm=False, use_parallel_residual=False,
        partial_rotary_factor=cfg.rotary_pct, rope_theta=cfg.rope_theta, hidden_dropout=0.0,
        attention_dropout=0.0, tie_word_embeddings=cfg.tie_embeddings,
    )


def _rename(name: str, pairs: list[tuple[str, str]], layer_from: str, layer_to: str) -> str:
    m = re.fullmatch(layer_from + r"\.(\d+)\.(.+)", name)
    if m:
        i, rest = m.groups()
        for src, dst in pairs:
            if rest.startswith(src + "."):
                return f"{layer_to}.{i}.{dst}{rest[len(src):]}"
        raise KeyError(f"no StableLM name for layer parameter {name!r}")
    for src, dst in _TOP_NAMES if layer_from == "layers" else [(b, a) for a, b in _TOP_NAMES]:
        if name.startswith(src + "."):
            return dst + name[len(src):]
    raise KeyError(f"no StableLM name for parameter {name!r}")


def to_stablelm(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> HF StableLM names (tensors are shared, not copied)."""
    return {_rename(k, _LAYER_NAMES, "layers", "model.layers"): v for k, v in state_dict.items()}


def from_stablelm(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF StableLM state dict -> our names (rotary caches and other buffers are dropped)."""
    swapped = [(b, a) for a, b in _LAYER_NAMES]
    return {
        _rename(k, swapped, r"model\.layers", "layers"): v
        for k, v in state_dict.items()
        if not k.endswith("rotary_emb.inv_freq")
    }
