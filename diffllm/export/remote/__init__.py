"""format=remote: any diffllm model (every arch, norm and rotary) as trust_remote_code files shipped with the export.

`configuration_diffllm.py` and `modeling_diffllm.py` import only torch and transformers (a user needs no diffllm);
`register_for_auto_class` makes `save_pretrained` copy them next to the weights and write `auto_map`. The weights keep
diffllm's own parameter names, so the export and the import are the identity on the state dict.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ...model import ModelConfig

NAME, HF_CLASS, MODEL_TYPE = "remote", "DiffLLMForCausalLM", "diffllm"


def why_not(cfg: ModelConfig) -> Optional[str]:
    return None  # the modeling file follows diffllm's equations for every layout


def hf_config(cfg: ModelConfig):
    from .configuration_diffllm import DiffLLMConfig
    from .modeling_diffllm import DiffLLMForCausalLM

    DiffLLMConfig.register_for_auto_class()
    DiffLLMForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    lambda_inits = [cfg.lambda_init_at(i) for i in range(cfg.n_layers)]  # read by Diff (V1) layers only
    return DiffLLMConfig(
        arch=cfg.arch, preset=cfg.name, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=cfg.kv_heads, ffn_dim=cfg.ffn_hidden, vocab_size=cfg.padded_vocab_size, norm=cfg.norm,
        norm_eps=cfg.norm_eps, rotary_pct=cfg.rotary_pct, rope_theta=cfg.rope_theta,
        rope_interleaved=cfg.rope_interleaved, qkv_bias=cfg.qkv_bias, tie_embeddings=cfg.tie_embeddings,
        init_std=cfg.init_std, max_seq_len=cfg.max_seq_len, lambda_inits=lambda_inits,
    )


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(sd)


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    skip = ("name", "vocab_multiple", "lambda_init")  # the preset name, the padded vocabulary, lambda_inits below
    kw = {k: getattr(hf_cfg, k) for k in names if k not in skip and hasattr(hf_cfg, k)}
    inits = getattr(hf_cfg, "lambda_inits", None)
    cfg = ModelConfig(name=hf_cfg.preset, vocab_multiple=1, **kw)
    if inits and any(abs(a - cfg.lambda_init_at(i)) > 0 for i, a in enumerate(inits)):
        if len(set(inits)) != 1:
            raise ValueError(f"{NAME}: config.json lambda_inits={inits} is neither diffllm's schedule nor a constant")
        cfg.lambda_init = float(inits[0])
    return cfg, dict(sd)
