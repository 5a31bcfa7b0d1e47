"""Our Diff Transformer in the paper's layout <-> Hugging Face's native `DiffLlamaForCausalLM`, exactly.

    ours: diff head i = query sub-heads (2i, 2i+1), key sub-heads (2j, 2j+1) and a 2d-wide value head j = i // n_rep;
          out = W_O concat_i[(1 - lambda_init) * w * RMSNorm(head_i)] (w: one subln weight shared by all heads)
    HF:   map 1 = heads 0..h-1, map 2 = heads h..2h-1 (kv heads j and g + j; value heads j and g + j are the two
          d-wide halves of our value head j); a per-head RMSNorm without weight; lambda_init = 0.8 - 0.6 exp(-0.3 l)

So the export moves q rows 2i -> i and 2i+1 -> h+i (k and the value halves likewise), folds w into W_O's columns
(exact because our subln eps is 1e-5 = rms_norm_eps), permutes q/k rows inside each head for interleaved rotary, and
for a constant lambda_init c re-solves the lambda vectors (same lambda) and folds (1 - c) / (1 - lambda_init(l)) into
W_O. The import runs the permutations backwards with a unit subln weight.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..model import ModelConfig
from ..model.diff_attention import lambda_init_at
from .convert import (
    add_zero_o_bias,
    check_config,
    common_config_kwargs,
    common_model_kwargs,
    drop_zero_o_bias,
    from_hf_names,
    inverse,
    map_qk,
    pair_major_order,
    permute_rows,
    rotate_half_layout,
    to_hf_names,
    unmet,
)

NAME, HF_CLASS, MODEL_TYPE = "diffllama", "DiffLlamaForCausalLM", "diffllama"
SUBLN_EPS = 1e-5  # diffllm's per-head norm eps (fixed); DiffLlama uses rms_norm_eps there


def hf_lambda_init(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)  # transformers' lambda_init_fn (0-based layer index)


def why_not(cfg: ModelConfig) -> Optional[str]:
    return unmet(
        cfg,
        "DiffLlama",
        {
            "arch": ("diff", "has differential attention (V1)"),
            "norm": ("rmsnorm", "has RMSNorm"),
            "rotary_pct": (1.0, "rotates the whole head"),
            "norm_eps": (SUBLN_EPS, "uses rms_norm_eps in its per-head norm, whose eps diffllm fixes at 1e-5,"),
        },
    )


def hf_config(cfg: ModelConfig):
    import transformers

    return transformers.DiffLlamaConfig(
        **common_config_kwargs(cfg),
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.norm_eps,
        attention_bias=cfg.qkv_bias,
        lambda_std_dev=cfg.lambda_std,
    )


def _pair_major(sd: dict, cfg: ModelConfig, to_hf: bool) -> dict:
    """q/k sub-heads and the value halves: adjacent pairs <-> [map 1 heads | map 2 heads]."""
    order = lambda n: pair_major_order(n) if to_hf else inverse(pair_major_order(n))  # noqa: E731
    sd = map_qk(sd, cfg, lambda t, n: permute_rows(t, n, head_order=order(n)))
    for name in [k for k in sd if ".attn.v_proj." in k]:  # our value head j = [half 2j | half 2j+1] of d each
        sd[name] = permute_rows(sd[name], cfg.kv_heads, head_order=order(cfg.kv_heads))
    return sd


def _solve_lambda(target: float, d: int) -> dict[str, torch.Tensor]:
    """Vectors with exp(q1.k1) - exp(q2.k2) = target: one non-zero entry each, so HF's dot product is exact."""
    a, b = (math.log1p(target), 0.0) if target >= 0 else (0.0, math.log1p(-target))
    e0 = torch.zeros(d)
    e0[0] = 1.0
    return {"lambda_q1": e0 * a, "lambda_k1": e0.clone(), "lambda_q2": e0 * b, "lambda_k2": e0.clone()}


def to_hf(
    cfg: ModelConfig, sd: dict[str, torch.Tensor], fold_subln: bool = True, pair_heads: bool = True
) -> dict[str, torch.Tensor]:
    """fold_subln / pair_heads=False exist for the negative tests (skipping either step must break the logits)."""
    sd = rotate_half_layout(sd, cfg)
    if pair_heads:
        sd = _pair_major(sd, cfg, to_hf=True)
    h = cfg.n_heads // 2
    for i in range(cfg.n_layers):
        p = f"layers.{i}.attn."
        w = sd.pop(p + "subln.weight")  # (2d,)
        c, ref = lambda_init_at(cfg, i), hf_lambda_init(i)
        scale = w.double().repeat(h) if fold_subln else torch.ones(w.numel() * h, dtype=torch.float64)
        scale = scale * ((1.0 - c) / (1.0 - ref))  # (h * 2d,) over W_O's input columns
        sd[p + "out_proj.weight"] = (sd[p + "out_proj.weight"].double() * scale).to(sd[p + "out_proj.weight"].dtype)
        if c != ref:
            lam = {n: sd[p + f"lambda_{n}"].double() for n in ("q1", "k1", "q2", "k2")}
            target = (torch.exp((lam["q1"] * lam["k1"]).sum()) - torch.exp((lam["q2"] * lam["k2"]).sum())).item()
            for n, t in _solve_lambda(target + c - ref, cfg.head_dim).items():
                sd[p + n] = t.to(sd[p + n].dtype)
    return add_zero_o_bias(to_hf_names(sd), cfg)


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    check_config(hf_cfg, {"rms_norm_eps": SUBLN_EPS}, NAME)
    cfg = ModelConfig(
        arch="diff",
        norm="rmsnorm",
        norm_eps=hf_cfg.rms_norm_eps,
        qkv_bias=bool(hf_cfg.attention_bias),
        lambda_std=getattr(hf_cfg, "lambda_std_dev", 0.1),
        **common_model_kwargs(hf_cfg, NAME),
    )
    ours = _pair_major(from_hf_names(drop_zero_o_bias(sd, NAME)), cfg, to_hf=False)
    for i in range(cfg.n_layers):
        ours[f"layers.{i}.attn.subln.weight"] = torch.ones(2 * cfg.head_dim)
    return cfg, ours
