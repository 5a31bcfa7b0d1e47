"""Differential attention V2 (unilm `Diff-Transformer-V2/multihead_flashdiffv2.py`), `arch: diff2`.

    Q = X W_Q  (2h heads of d),  K = X W_K,  V = X W_V  (h_kv heads of d each, as the h-head Transformer)
    O = softmax(Q K^T / sqrt d + causal) V              (one standard call with 2h query heads, GQA)
    lambda = sigmoid(X W_lambda)                         (W_lambda: d_model -> h, no bias; per token and per head)
    head_i = O_{2i} - lambda_i O_{2i+1}                  (B, T, h, d)
    out    = W_O concat_i head_i                         (h d -> d_model, as the Transformer's W_O)

No lambda vectors, no lambda_init, no subln, no (1 - lambda_init). Query heads 2i and 2i+1 read the same kv head
i // (h / h_kv) (query head j reads j // (2h / h_kv)), so the pair shares its K and V: h_kv must divide h.
n_heads in the config is h (the Transformer's head count); the KV cache equals the Transformer's.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .layers import AttentionEquations
from .registry import register
from .variant import AttentionVariant, Heads


class Diff2Equations(AttentionEquations):
    """The equations above (torch only: shipped with the export)."""

    def __init__(self, cfg, depth):
        super().__init__(cfg, depth)
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads  # h, h_kv
        self.head_dim = cfg.d_model // cfg.n_heads  # d
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.qkv_bias)  # 2h heads of d
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.lambda_proj = nn.Linear(cfg.d_model, self.n_heads, bias=False)  # init: N(0, init_std) as every matrix

    def project(self, x, cos, sin):
        """q (B, 2h, T, d): heads 2i, 2i+1 share kv head i // (h/g); k, v (B, g, T, d), the standard cache."""
        q = self.rotated(self.q_proj, x, 2 * self.n_heads, cos, sin)  # (B, T, 2h, d)
        k = self.rotated(self.k_proj, x, self.n_kv_heads, cos, sin)  # (B, T, g, d)
        v = self.v_proj(x).view(k.shape)  # (B, T, g, d)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def mix(self, x, o):
        """o (B, 2h, T, *) -> o_2i - lambda_i o_2i+1 (B, h, T, *), lambda = sigmoid(x W_lambda) per token and head."""
        lam = torch.sigmoid(self.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1)
        return o[:, 0::2] - lam * o[:, 1::2]

    def finish(self, x, y):
        """y (B, h, T, d) -> W_O concat_i y_i."""
        return self.out_proj(y.transpose(1, 2).reshape(x.shape))


@register
class Diff2Attention(AttentionVariant, Diff2Equations):
    arch, label, color = "diff2", "Diff Transformer V2", "tab:green"
    map_normalisation = "(A1 - lambda A2) / (1 - lambda)"
    # W_Q, W_K, W_V, W_O and W_lambda (width -> h: the head count scales with width); q/k/v biases
    mup = {"*_proj.weight": "hidden", "*_proj.bias": "vector"}

    def probes(self):
        """lambda_mean: the mean of sigmoid(x W_lambda) over the step's tokens and heads."""
        return {"lambda_mean": (self.lambda_proj, lambda z: torch.sigmoid(z.detach().float()).mean())}

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        d = cfg.head_dim
        return Heads(query=2 * cfg.n_heads, kv=cfg.kv_heads, out=cfg.n_heads, value_dim=d, key_dim=d)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """The Transformer's + h*d*E for the second query half + E*h for lambda_proj."""
        E, kv, h = cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.n_heads
        return 2 * E * E + 2 * E * kv + E * E + E * h + (2 * E + 2 * kv) * cfg.qkv_bias

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """2h query heads of d (2E wide): scores 4*T*E and values 4*T*E per layer forward on every backend, x3."""
        return 3.0 * cfg.n_layers * (4 * seq_len * cfg.d_model + 4 * seq_len * cfg.d_model)
