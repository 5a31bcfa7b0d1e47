"""μP (Yang et al. 2022, Tensor Programs V) for AdamW, `model.parametrization: mup`: how each parameter is treated.

The base model is this one with every size but the vocabulary and the head dim divided by width_mult = d_model /
base_width (head count, kv heads, SwiGLU width scale with d_model). A parameter is one of

    kind     examples                                   AdamW lr    init std           forward
    hidden   every projection matrix (width x width)    lr / m      init_std / sqrt m  as is
    vector   embedding, norm gains, biases, Diff's      lr          as sp              as is
             lambda vectors and subln weight
    readout  lm_head (width -> vocab); MLA's maps       lr          as sp              input / m
             from the width to a fixed latent rank

(m = width_mult), and attention logits are q.k sqrt(base_head_dim) / d instead of q.k / sqrt(d) (base_head_dim:
the model's own head dim unless set). A hidden matrix's weight decay is multiplied by m, so AdamW's lr x wd stays
(`mup.MuAdamW`'s default, decoupled_wd=False). At width_mult 1 everything is sp's, bit for bit.

`model.parametrization: completep` is μP plus CompleteP's depth rules (Dey et al. 2025, arXiv 2505.01618, Table 1 with
α = 1; EleutherAI/nanoGPT-mup branch `completep`): with depth_mult = n_layers / base_depth, every residual branch is
scaled by depth_mult^-1 (x + F(x) / depth_mult), and AdamW's ε of every parameter inside a block (its matrices, norm
weights, biases, the variant's vectors) by depth_mult^-1. At α = 1 the depth factors of the hidden lr (L^(α-1)), the
hidden weight decay and the init are 1, so they are μP's. CompleteP's ε also carries a width factor 1/m that μP's
reference (`mup.MuAdamW`) does not: diffllm leaves ε's width alone, so at depth_mult 1 completep is mup exactly.

Who declares what: the model's own parameters in `MODEL_TREATMENT` below; each attention variant its own in its
class attribute `mup` (fnmatch patterns of its parameters' local names -> kind, first match wins), or in its
classmethod `mup_table(cfg)` where the kinds depend on which of its widths grow (MLA). A variant without one is
refused under mup (`check`), never silently sp. tests/model/test_mup.py checks every declaration
against the `mup` package's own classification (set_base_shapes + MuAdamW) of the same model.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from .config import ModelConfig

KINDS = ("hidden", "vector", "readout")

# The decoder's own parameters (names in DecoderLM without the `layers.<i>.` prefix; attention's are its variant's).
MODEL_TREATMENT = {
    "tok_embeddings.weight": "vector",  # input embedding: vocab (finite) x width
    "*norm.weight": "vector",  # attn_norm, mlp_norm, the final norm
    "*norm.bias": "vector",  # layernorm
    "mlp.*.weight": "hidden",  # SwiGLU gate/up (width -> ffn) and down (ffn -> width)
    "lm_head.weight": "readout",  # width -> vocab; a tied head is the embedding (its one treatment: vector)
}


def is_mup(cfg: ModelConfig) -> bool:
    """Whether the width rules of μP apply: under mup and under completep (μP + depth rules)."""
    return cfg.parametrization in ("mup", "completep")


def width_mult(cfg: ModelConfig) -> float:
    """m = d_model / base_width under mup and completep (base_width null: 1); 1 under sp."""
    if not is_mup(cfg) or cfg.base_width is None:
        return 1.0
    return cfg.d_model / cfg.base_width


def depth_mult(cfg: ModelConfig) -> float:
    """n_layers / base_depth under completep (base_depth null: 1); 1 otherwise."""
    if cfg.parametrization != "completep" or cfg.base_depth is None:
        return 1.0
    return cfg.n_layers / cfg.base_depth


def branch_scale(cfg: ModelConfig) -> float:
    """What each residual branch's output is multiplied by: depth_mult^-α with CompleteP's α = 1."""
    return 1.0 / depth_mult(cfg)


def eps_mult(name: str, cfg: ModelConfig) -> float:
    """AdamW's ε multiplier of parameter `name` (named_parameters): depth_mult^-1 inside a block under completep."""
    return 1.0 / depth_mult(cfg) if name.startswith("layers.") else 1.0


def query_scale(cfg: ModelConfig) -> float:
    """What the queries are multiplied by so the kernels' 1/sqrt(d) becomes sqrt(base_head_dim)/d: sqrt(d_base/d)."""
    if not is_mup(cfg) or cfg.base_head_dim is None:
        return 1.0
    return math.sqrt(cfg.base_head_dim / cfg.head_dim)


def readout_scale(cfg: ModelConfig) -> float:
    """The logits' multiplier: 1/m (mup's MuReadout with output_mult 1)."""
    return 1.0 / width_mult(cfg)


def lookup(table: dict[str, str], name: str, owner: str) -> str:
    """The kind of parameter `name` by the first pattern of `table` it matches; unmatched -> UserError."""
    for pattern, kind in table.items():
        if fnmatch.fnmatchcase(name, pattern):
            if kind not in KINDS:
                raise UserError(f"{owner}: mup treatment {kind!r} of {pattern!r} is not one of {KINDS}")
            return kind
    raise UserError(f"{owner}: its mup table declares no treatment for parameter {name!r}")


def treatments(model: nn.Module) -> dict[str, str]:
    """Every parameter of a DecoderLM (named_parameters names; a tied head once, as the embedding) -> its kind."""
    kinds = {}
    for i, layer in enumerate(model.layers):
        table = type(layer.attn).mup_table(model.cfg)
        if table is None:
            raise UserError(f"model.parametrization: arch {model.cfg.arch!r} declares no mup treatment")
        for local, _ in layer.attn.named_parameters():
            kinds[f"layers.{i}.attn.{local}"] = lookup(table, local, f"arch {model.cfg.arch!r}")
    for name, _ in model.named_parameters():
        if name not in kinds:
            local = name.split(".", 2)[2] if name.startswith("layers.") else name
            kinds[name] = lookup(MODEL_TREATMENT, local, "DecoderLM")
    return kinds


def lr_mult(kind: str, m: float) -> float:
    """AdamW's per-parameter lr multiplier."""
    return 1.0 / m if kind == "hidden" else 1.0


def init_mult(kind: str, m: float) -> float:
    """The multiplier of the sp init std (matrices N(0, init_std))."""
    return 1.0 / math.sqrt(m) if kind == "hidden" else 1.0


def folded(cfg: ModelConfig, state_dict: dict) -> tuple[ModelConfig, dict]:
    """(an sp config, weights) whose sp forward equals this mup model's: the readout's 1/width_mult folded into
    lm_head, the variant's own multipliers into their parameters (`mup_folds`: MLA's readouts, Diff's scaled lambda),
    the query scale into the parameters that make the queries (`query_weights`: q_proj's weight and bias by default),
    completep's branch scale into each branch's last matrix (attn.out_proj, mlp.down_proj). What an export writes."""
    if cfg.parametrization == "sp":
        return cfg, state_dict
    variant = cfg.variant
    r, q, sd = readout_scale(cfg), variant.mup_query_scale(cfg), dict(state_dict)
    queries = variant.query_weights(cfg)
    attention = {k: k.split(".", 3)[3] for k in sd if k.split(".")[2:3] == ["attn"]}  # layers.<i>.attn.<local>
    if r != 1.0:
        if cfg.tie_embeddings:
            raise UserError(
                "export: a mup model with tied embeddings cannot fold its readout scale into the shared weight"
            )
        sd["lm_head.weight"] = sd["lm_head.weight"] * r
    folds = variant.mup_folds(cfg)  # MLA's readouts, Diff's scaled lambda
    sd.update({k: sd[k] * folds[local] for k, local in attention.items() if local in folds})
    if q != 1.0:
        found = [k for k, local in attention.items() if local in queries]
        if len(found) < cfg.n_layers:
            raise UserError(f"export: arch {cfg.arch!r} has no attn.{queries[0]} to fold mup's query scale into")
        sd.update({k: sd[k] * q for k in found})
    if (b := branch_scale(cfg)) != 1.0:
        last = [k for k in sd if k.endswith((".attn.out_proj.weight", ".mlp.down_proj.weight"))]
        if len(last) != 2 * cfg.n_layers:
            raise UserError(f"export: arch {cfg.arch!r} has no attn.out_proj to fold completep's branch scale into")
        sd.update({k: sd[k] * b for k in last})
    return replace(cfg, parametrization="sp", base_width=None, base_head_dim=None, base_depth=None), sd
