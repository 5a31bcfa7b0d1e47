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

from typing import Optional

import torch
from torch import nn

from .attention import causal_attention, heads_of
from .cache import LayerCache
from .config import ModelConfig
from .documents import Documents
from .layers import apply_rotary
from .remote import RemoteAttention, attend
from .variant import AttentionVariant, Heads, register


class Diff2Remote(RemoteAttention):
    """The format=remote export's Diff V2 attention (diffllm/model/remote.py)."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, 2 * config.n_heads, config.n_kv_heads, config.d_model // config.n_heads)
        self.lambda_proj = nn.Linear(config.d_model, config.n_heads, bias=False)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        q, k, v = self.qkv(x, cos, sin)  # (B, T, 2h, d), (B, T, g, d), (B, T, g*d)
        k, v = self.cached(k.transpose(1, 2), v.view(B, T, -1, self.d).transpose(1, 2), cache)  # (B, g, S, d)
        o = attend(q.transpose(1, 2), k, v, mask).transpose(1, 2)  # (B, T, 2h, d): heads 2i, 2i+1 share a kv head
        lam = torch.sigmoid(self.lambda_proj(x)).unsqueeze(-1)  # (B, T, h, 1)
        return self.out_proj((o[:, :, 0::2] - lam * o[:, :, 1::2]).reshape(B, T, E))


@register
class Diff2Attention(AttentionVariant):
    arch, label, color = "diff2", "Diff Transformer V2", "tab:green"
    map_normalisation = "(A1 - lambda A2) / (1 - lambda)"
    remote = Diff2Remote

    def __init__(self, cfg: ModelConfig, depth: int, backend: str | None = None):
        super().__init__(cfg, depth, backend)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim  # h, h_kv, d
        self.interleaved = cfg.rope_interleaved
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.qkv_bias)  # 2h heads of d
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.lambda_proj = nn.Linear(cfg.d_model, self.n_heads, bias=False)  # init: N(0, init_std) as every matrix

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerCache] = None, docs: Optional[Documents] = None) -> torch.Tensor:
        B, T, E = x.shape
        h, g, d = self.n_heads, self.n_kv_heads, self.head_dim
        q = apply_rotary(self.q_proj(x).view(B, T, 2 * h, d), cos, sin, self.interleaved)  # (B, T, 2h, d)
        k = apply_rotary(self.k_proj(x).view(B, T, g, d), cos, sin, self.interleaved)  # (B, T, g, d)
        v = self.v_proj(x).view(B, T, g, d)  # (B, T, g, d)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, g, T, d)
        if cache is not None:
            k, v = cache.update(k, v)  # the standard cache: (B, g, pos + T, d)
        o = causal_attention(q.transpose(1, 2), k, v, self.backend, docs)  # (B, 2h, T, d); docs: within documents
        o = o.transpose(1, 2)  # (B, T, 2h, d)
        lam = torch.sigmoid(self.lambda_proj(x)).unsqueeze(-1)  # (B, T, h, 1)
        attn = o[:, :, 0::2] - lam * o[:, :, 1::2]  # (B, T, h, d)
        return self.out_proj(attn.reshape(B, T, E))

    def map_parts(self, x, cos, sin):
        """[(q of heads 0, 2, .., k), (q of heads 1, 3, .., k)], each (B, h, T, d) in fp32 (query head j reads kv
        head j // (2h/g)), and lambda = sigmoid(lambda_proj(x)) as (B, h, T, 1): one per head and query token.
        Doc-unaware: eval attention rebuilds causal maps over whole windows."""
        h, g, d = self.n_heads, self.n_kv_heads, self.head_dim
        q = apply_rotary(heads_of(self.q_proj(x), 2 * h, d), cos, sin, self.interleaved).transpose(1, 2).float()
        k = apply_rotary(heads_of(self.k_proj(x), g, d), cos, sin, self.interleaved).transpose(1, 2).float()
        k = k.repeat_interleave(2 * h // g, dim=1)  # (B, 2h, T, d): query head j's keys
        lam = torch.sigmoid(self.lambda_proj(x).float()).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1)
        return [(q[:, 0::2], k[:, 0::2]), (q[:, 1::2], k[:, 1::2])], lam.detach()

    def output_from_maps(self, x, maps, lam):
        B, T, E = x.shape
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2).float()  # (B, g, T, d)
        v = v.repeat_interleave(2 * self.n_heads // self.n_kv_heads, dim=1)[:, 0::2]  # pair i's kv head: (B, h, T, d)
        y = (maps[0] - lam * maps[1]) @ v  # (B, h, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        return Heads(query=2 * cfg.n_heads, kv=cfg.kv_heads, out=cfg.n_heads, value_dim=cfg.head_dim)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """The Transformer's + h*d*E for the second query half + E*h for lambda_proj."""
        E, kv, h = cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.n_heads
        return 2 * E * E + 2 * E * kv + E * E + E * h + (2 * E + 2 * kv) * cfg.qkv_bias

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """2h query heads of d (2E wide): scores 4*T*E and values 4*T*E per layer forward on every backend, x3."""
        return 3.0 * cfg.n_layers * (4 * seq_len * cfg.d_model + 4 * seq_len * cfg.d_model)
