"""Our MLA (`arch: mla`, diffllm/model/mla_attention.py) <-> Hugging Face's native `DeepseekV3ForCausalLM`, dense MLP
layers only (`first_k_dense_replace` = every layer, so no routed expert is ever built).

Exact: MLA's parameters carry DeepseekV3Attention's names (q_proj or q_a_proj/q_a_layernorm/q_b_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; out_proj is HF's o_proj) and the block is the Llama family's, so the
weights map by the shared name table alone (convert.py). RoPE: DeepseekV3 rotates `head_dim = qk_rope_head_dim`
dims and reads interleaved pairs when `rope_interleave` (our `rope_interleaved`); its latent RMSNorms use eps 1e-6,
as ours do. What it cannot express (qkv_bias: its attention_bias also biases o_proj and not a full-rank q_proj;
LayerNorm) goes to format=remote.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import UserError
from ..model import ModelConfig
from ..model.mla_attention import mla_dims
from .convert import check_config, common_config_kwargs, from_hf_names, rope_theta, to_hf_names, unmet

NAME, HF_CLASS, MODEL_TYPE = "deepseek_v3", "DeepseekV3ForCausalLM", "deepseek_v3"


def why_not(cfg: ModelConfig) -> Optional[str]:
    """None if DeepseekV3 represents `cfg` exactly, else why not."""
    return unmet(
        cfg,
        "DeepseekV3",
        {
            "arch": ("mla", "has latent attention"),
            "norm": ("rmsnorm", "has RMSNorm"),
            "qkv_bias": (False, "biases o_proj with its attention_bias and has no full-rank q_proj bias"),
        },
    )


def hf_config(cfg: ModelConfig):
    import transformers

    dq, dc, dn, dr, dv = mla_dims(cfg)
    return transformers.DeepseekV3Config(
        **common_config_kwargs(cfg),
        q_lora_rank=dq,
        kv_lora_rank=dc,
        qk_nope_head_dim=dn,
        qk_rope_head_dim=dr,
        v_head_dim=dv,
        rope_interleave=cfg.rope_interleaved,
        rms_norm_eps=cfg.norm_eps,
        attention_bias=False,
        first_k_dense_replace=cfg.n_layers,  # every layer a dense SwiGLU MLP: no MoE is built
        n_routed_experts=1,
        n_shared_experts=0,
        num_experts_per_tok=1,
        n_group=1,
        topk_group=1,
        num_nextn_predict_layers=0,
    )


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return to_hf_names(sd)


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    check_config(hf_cfg, {"hidden_act": "silu", "attention_bias": False}, NAME)
    if (hf_cfg.first_k_dense_replace or 0) < hf_cfg.num_hidden_layers:
        raise UserError(
            f"{NAME}: config.json first_k_dense_replace={hf_cfg.first_k_dense_replace} < num_hidden_layers="
            f"{hf_cfg.num_hidden_layers}: mixture-of-experts layers are not supported (diffllm needs dense MLPs)"
        )
    rope = (getattr(hf_cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        raise UserError(f"{NAME}: config.json rope_type={rope!r} (RoPE scaling) is not supported (needs 'default')")
    if hf_cfg.hidden_size % hf_cfg.num_attention_heads:
        raise UserError(f"{NAME}: hidden_size={hf_cfg.hidden_size} is not a multiple of the head count")
    cfg = ModelConfig(
        name=getattr(hf_cfg, "_name_or_path", "") and str(hf_cfg._name_or_path).rstrip("/").split("/")[-1] or NAME,
        arch="mla",
        d_model=hf_cfg.hidden_size,
        n_layers=hf_cfg.num_hidden_layers,
        n_heads=hf_cfg.num_attention_heads,
        ffn_dim=hf_cfg.intermediate_size,
        vocab_size=hf_cfg.vocab_size,
        vocab_multiple=1,
        norm="rmsnorm",
        norm_eps=hf_cfg.rms_norm_eps,
        rope_theta=rope_theta(hf_cfg),
        rope_interleaved=bool(hf_cfg.rope_interleave),
        tie_embeddings=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
        init_std=getattr(hf_cfg, "initializer_range", 0.02),
        max_seq_len=hf_cfg.max_position_embeddings,
        q_lora_rank=hf_cfg.q_lora_rank,
        kv_lora_rank=hf_cfg.kv_lora_rank,
        qk_nope_head_dim=hf_cfg.qk_nope_head_dim,
        qk_rope_head_dim=hf_cfg.qk_rope_head_dim,
        v_head_dim=hf_cfg.v_head_dim,
    )
    return cfg, from_hf_names(sd)
