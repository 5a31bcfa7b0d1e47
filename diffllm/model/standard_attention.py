"""Standard causal multi-head / grouped-query attention, the Transformer's variant (`arch: transformer`):

Q = X W_Q (h heads of d),  K = X W_K,  V = X W_V (h_kv heads of d)
out = W_O concat_i softmax(Q_i K_g(i)^T / sqrt d + causal) V_g(i)       g(i) = i // (h / h_kv)
"""

from __future__ import annotations

from torch import nn

from .config import ModelConfig
from .layers import AttentionEquations
from .registry import register
from .variant import AttentionVariant, Heads


class TransformerEquations(AttentionEquations):
    """n_heads query heads and n_kv_heads kv heads of d = d_model / n_heads (torch only: shipped with the export)."""

    def __init__(self, cfg, depth):
        super().__init__(cfg, depth)
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads  # d
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def project(self, x, cos, sin):
        q = self.rotated(self.q_proj, x, self.n_heads, cos, sin)  # (B, T, H, d)
        k = self.rotated(self.k_proj, x, self.n_kv_heads, cos, sin)  # (B, T, Hkv, d)
        v = self.v_proj(x).view(k.shape)  # (B, T, Hkv, d)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H*, T, d)

    def finish(self, x, y):
        """y (B, H, T, d) -> W_O concat_i y_i."""
        return self.out_proj(y.transpose(1, 2).reshape(x.shape))


@register
class StandardAttention(AttentionVariant, TransformerEquations):
    arch, label, color, baseline = "transformer", "Transformer", "tab:blue", True
    mup = {"*_proj.weight": "hidden", "*_proj.bias": "vector"}  # W_Q, W_K, W_V, W_O; q/k/v biases

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        return Heads(query=cfg.n_heads, kv=cfg.kv_heads, out=cfg.n_heads, value_dim=cfg.head_dim, key_dim=cfg.head_dim)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        E, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
        return E * E + 2 * E * kv + E * E + (E + 2 * kv) * cfg.qkv_bias  # W_Q, W_K, W_V, W_O (+ q/k/v biases)

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Scores 2*T*E + values 2*T*E per layer forward (h heads of d = E), x3 for fwd + bwd."""
        return 3.0 * cfg.n_layers * (2 * seq_len * cfg.d_model + 2 * seq_len * cfg.d_model)
