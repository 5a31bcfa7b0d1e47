"""Multi-head Latent Attention (DeepSeek-V2, arXiv 2405.04434 §2.1), `arch: mla`. Per token h (the attention input):

    c_Q = RMSNorm(W_DQ h)                       (q_lora_rank d_c'; without it q comes from h by one full W_Q)
    [q^C_i; q^R_i] = W_UQ c_Q                   (H heads of qk_nope_head_dim d_n + qk_rope_head_dim d_r)
    q^R_i = RoPE(q^R_i)
    [c_KV; k^R] = W_DKV h                       (kv_lora_rank d_c, and d_r: W_DKV and W_KR as one matrix)
    c_KV = RMSNorm(c_KV),  k^R = RoPE(k^R)      (one RoPE key shared by all heads)
    [k^C_i; v_i] = W_UKV c_KV                   (per head d_n keys and v_head_dim d_v values)
    o_i = softmax([q^C_i; q^R_i] . [k^C_i; k^R]^T / sqrt(d_n + d_r) + causal) v_i
    out = W_O concat_i o_i

The KV cache holds c_KV and k^R only, d_c + d_r numbers per token and layer. `project` gives the plain form (per-head q,
k, v: what training, eval's maps and the export run); a forward with a cache runs the absorbed form: W_UK folded into
the queries (q^C_i W_UK_i: d_c wide) and W_UV into the output, one standard call of H query heads over ONE key head
[c_KV; k^R] and ONE value head c_KV (MQA over the latent), then v_i = o_i W_UV_i. Both give the same outputs
(tests/model/test_mla_attention.py). Parameter names follow transformers' DeepseekV3Attention
(but out_proj, every variant's name for W_O; HF's o_proj).

Config keys (ModelConfig variant options, None -> DeepSeek-V2's ratios to d = d_model / n_heads): q_lora_rank (None: a
full W_Q), kv_lora_rank (4d), qk_nope_head_dim (d), qk_rope_head_dim (d/2, rounded down to even), v_head_dim (d).
MLA reads neither n_kv_heads (one latent serves every head) nor rotary_pct (its RoPE width is qk_rope_head_dim).

Under parametrization=mup a projection's kind depends on which of its widths grow with d_model (`mup_table`, by the
rule of mup's set_base_shapes: a dimension is infinite where the base model and a twice-as-wide one differ). Growing
by heads at a fixed head dim, the latent ranks stay put: W_DQ and W_DKV map the width to a fixed size (readouts: their
input x 1/width_mult, as mup's MuReadout), W_UQ and W_UKV map a fixed size to the width (vectors), W_Q and W_O are
hidden. Growing the head dim too (base_head_dim), the default ranks grow with it and every projection is hidden.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional

import torch
from torch import nn

from ..errors import UserError
from .cache import LayerCache
from .config import ModelConfig
from .documents import Documents
from .layers import AttentionEquations, RMSNorm, apply_rotary, heads_of
from .parametrization import is_mup
from .registry import register
from .variant import AttentionVariant, Heads


class MLAEquations(AttentionEquations):
    """The equations above (torch only, and self-contained: the export ships this class's source)."""

    latent_norm_eps = 1e-6  # DeepSeek's q_a_layernorm / kv_a_layernorm

    @staticmethod
    def dims(cfg) -> tuple:
        """(q_lora_rank, kv_lora_rank d_c, qk_nope_head_dim d_n, qk_rope_head_dim d_r, v_head_dim d_v), the Nones
        filled in from d = d_model / n_heads with DeepSeek-V2's ratios (d_c = 4d, d_n = d_v = d, d_r = d/2 even)."""
        d = cfg.d_model // cfg.n_heads
        given = (cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)
        defaults = (4 * d, d, 2 * max(1, d // 4), d)
        return (cfg.q_lora_rank, *(default if v is None else v for v, default in zip(given, defaults)))

    def __init__(self, cfg, depth):
        super().__init__(cfg, depth)
        self.input_scale = {}  # mup: each readout projection's input multiplier (1 / width_mult); sp: none
        self.n_heads = H = cfg.n_heads
        self.q_lora_rank, self.kv_lora_rank, self.nope_dim, self.rope_dim, self.v_dim = self.dims(cfg)
        E, dq, dc, qk = cfg.d_model, self.q_lora_rank, self.kv_lora_rank, self.nope_dim + self.rope_dim
        if dq is None:
            self.q_proj = nn.Linear(E, H * qk, bias=cfg.qkv_bias)
        else:
            self.q_a_proj = nn.Linear(E, dq, bias=cfg.qkv_bias)  # W_DQ
            self.q_a_layernorm = RMSNorm(dq, eps=self.latent_norm_eps)
            self.q_b_proj = nn.Linear(dq, H * qk, bias=False)  # W_UQ and W_QR
        self.kv_a_proj_with_mqa = nn.Linear(E, dc + self.rope_dim, bias=cfg.qkv_bias)  # W_DKV and W_KR
        self.kv_a_layernorm = RMSNorm(dc, eps=self.latent_norm_eps)
        self.kv_b_proj = nn.Linear(dc, H * (self.nope_dim + self.v_dim), bias=False)  # W_UK and W_UV, per head
        self.out_proj = nn.Linear(H * self.v_dim, E, bias=False)

    def read(self, name, x):
        """Projection `name` of x, its input scaled where mup made it a readout."""
        return getattr(self, name)(x * self.input_scale[name] if name in self.input_scale else x)

    def queries(self, x, cos, sin):
        """q^C (B, H, T, d_n), RoPE(q^R) (B, H, T, d_r)."""
        if self.q_lora_rank is None:
            q = self.read("q_proj", x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.read("q_a_proj", x)))
        q_nope, q_rope = heads_of(q, self.n_heads).split([self.nope_dim, self.rope_dim], dim=-1)  # (B, T, H, *)
        return q_nope.transpose(1, 2), apply_rotary(q_rope, cos, sin, self.interleaved).transpose(1, 2)

    def latent(self, x, cos, sin):
        """What the cache holds: RMSNorm(c_KV) (B, 1, T, d_c) and RoPE(k^R) (B, 1, T, d_r)."""
        c, k_rope = self.read("kv_a_proj_with_mqa", x).split([self.kv_lora_rank, self.rope_dim], dim=-1)  # (B, T, *)
        k_rope = apply_rotary(k_rope.unsqueeze(2), cos, sin, self.interleaved)  # (B, T, 1, d_r)
        return self.kv_a_layernorm(c).unsqueeze(1), k_rope.transpose(1, 2)

    def up(self):
        """W_UK (H, d_n, d_c) and W_UV (H, d_v, d_c), per head, from kv_b_proj."""
        w = self.kv_b_proj.weight * self.input_scale.get("kv_b_proj", 1.0)  # a readout where its fan-in grows
        w = w.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        return w.split([self.nope_dim, self.v_dim], dim=1)

    def project(self, x, cos, sin):
        """The plain form: q, k (B, H, T, d_n + d_r) = [q^C; q^R], [k^C; k^R]; v (B, H, T, d_v)."""
        q_nope, q_rope = self.queries(x, cos, sin)
        c, k_rope = self.latent(x, cos, sin)
        kv = heads_of(self.read("kv_b_proj", c.squeeze(1)), self.n_heads).transpose(1, 2)  # (B, H, T, d_n + d_v)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, self.n_heads, -1, -1)), dim=-1)  # k^R shared by every head
        return torch.cat((q_nope, q_rope), dim=-1), k, v

    def absorbed_queries(self, q_nope, q_rope):
        """[q^C_i W_UK_i; q^R_i] (B, H, T, d_c + d_r), scaled so that a kernel's 1/sqrt(d_c + d_r) becomes MLA's
        1/sqrt(d_n + d_r): its scores against [c_KV; k^R] are the plain form's."""
        w_uk, _ = self.up()
        q = torch.cat((torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk), q_rope), dim=-1)
        return q * ((self.kv_lora_rank + self.rope_dim) / (self.nope_dim + self.rope_dim)) ** 0.5

    def absorbed_values(self, o):
        """o (B, H, T, d_c), each head's softmax-weighted c_KV -> v (B, H, T, d_v) = o_i W_UV_i^T."""
        _, w_uv = self.up()
        return torch.einsum("bhtc,hvc->bhtv", o, w_uv)

    def finish(self, x, y):
        """y (B, H, T, d_v) -> W_O concat_i y_i."""
        B, T = x.shape[:2]
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1))


mla_dims = MLAEquations.dims

MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

# Each projection: (fan-in, fan-out) as functions of (d_model E, n_heads H, (d_c', d_c, d_n, d_r, d_v)).
PROJECTIONS = {
    "q_proj": lambda E, H, d: (E, H * (d[2] + d[3])),
    "q_a_proj": lambda E, H, d: (E, d[0]),
    "q_b_proj": lambda E, H, d: (d[0], H * (d[2] + d[3])),
    "kv_a_proj_with_mqa": lambda E, H, d: (E, d[1] + d[3]),
    "kv_b_proj": lambda E, H, d: (d[1], H * (d[2] + d[4])),
    "out_proj": lambda E, H, d: (H * d[4], E),
}


def base_shapes(cfg: ModelConfig, delta: bool = False) -> tuple:
    """(E, H, dims) of mup's base model, or of its delta (twice as wide, grown the way this model grew from the base:
    by heads, by head dim, or both; at width_mult 1 by heads, the docs' rule). The base: d_model base_width in heads of
    base_head_dim (null: this head dim); every rank and head dim by `dims`'s rules from there."""
    width, head_dim = cfg.base_width or cfg.d_model, cfg.base_head_dim or cfg.head_dim
    heads = max(1, width // head_dim)
    if delta:
        by_head_dim = head_dim != cfg.head_dim
        by_heads = heads != cfg.n_heads or not by_head_dim
        heads, head_dim = heads * (1 + by_heads), head_dim * (1 + by_head_dim)
        width = heads * head_dim
    shape = SimpleNamespace(**{k: getattr(cfg, k) for k in MLA_KEYS}, d_model=width, n_heads=heads)
    return width, heads, mla_dims(shape)


@register
class MLAAttention(AttentionVariant, MLAEquations):
    arch, label, color = "mla", "MLA", "tab:orange"

    def __init__(self, cfg: ModelConfig, depth: int, backend: Optional[str] = None):
        super().__init__(cfg, depth, backend)
        self.input_scale = {n.removesuffix(".weight"): s for n, s in self.mup_folds(cfg).items()}  # readouts

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: Optional[LayerCache] = None,
        docs: Optional[Documents] = None,
    ) -> torch.Tensor:
        """Without a cache the plain form (AttentionVariant's forward over `project`); with one, the cache stores
        c_KV and k^R and the absorbed form attends over all cached positions."""
        if cache is None:
            return super().forward(x, cos, sin, None, docs)
        q_nope, q_rope = (q * self.query_scale for q in self.queries(x, cos, sin))  # as scaled_project's
        c, k_rope = cache.update(*self.latent(x, cos, sin))  # (B, 1, S, d_c), (B, 1, S, d_r)
        return self.finish(x, self.attend_absorbed(x, q_nope, q_rope, c, k_rope, docs))

    def attend_absorbed(self, x, q_nope, q_rope, c, k_rope, docs: Optional[Documents]) -> torch.Tensor:
        """The absorbed form: H query heads over one latent key [c_KV; k^R] and one latent value c_KV
        -> (B, H, T, d_v)."""
        q = self.absorbed_queries(q_nope, q_rope)  # (B, H, T, d_c + d_r)
        o = self.attend(x, q, torch.cat((c, k_rope), dim=-1), c, docs)  # (B, H, T, d_c)
        return self.absorbed_values(o)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        dq, dc, dn, dr, dv = mla_dims(cfg)
        for key, value in (("q_lora_rank", dq), ("kv_lora_rank", dc), ("qk_nope_head_dim", dn), ("v_head_dim", dv)):
            if value is not None and value < 1:
                raise UserError(f"model.{key}: must be positive (or null), got {value}")
        if dr < 2 or dr % 2:
            raise UserError(f"model.qk_rope_head_dim: must be even and positive (rotary pairs), got {dr}")

    @classmethod
    def rotary_dim(cls, cfg: ModelConfig) -> int:
        return mla_dims(cfg)[3]

    @classmethod
    def mup_table(cls, cfg: ModelConfig) -> dict[str, str]:
        """Each projection's kind by which of its two widths grow (differ between mup's base model and its delta):
        both -> hidden, the fan-in only -> readout, else vector; biases and the latent norms are vectors."""
        (E0, H0, d0), (E1, H1, d1) = base_shapes(cfg), base_shapes(cfg, delta=True)
        table = {}
        for name, fans in PROJECTIONS.items():
            if name.startswith("q_") and (name == "q_proj") != (cfg.q_lora_rank is None):
                continue  # W_Q, or W_DQ and W_UQ
            grows_in, grows_out = (a != b for a, b in zip(fans(E0, H0, d0), fans(E1, H1, d1)))
            table[f"{name}.weight"] = "hidden" if grows_in and grows_out else "readout" if grows_in else "vector"
        return {**table, "*.bias": "vector", "*_layernorm.weight": "vector"}

    @classmethod
    def mup_folds(cls, cfg: ModelConfig) -> dict[str, float]:
        """Each readout's input multiplier under mup: its fan-in's base / its fan-in (mup's MuReadout: 1/width_mult)."""
        if not is_mup(cfg):
            return {}
        (E0, H0, d0), kinds = base_shapes(cfg), cls.mup_table(cfg)
        E, H, d = cfg.d_model, cfg.n_heads, mla_dims(cfg)
        return {
            f"{name}.weight": fans(E0, H0, d0)[0] / fans(E, H, d)[0]
            for name, fans in PROJECTIONS.items()
            if kinds.get(f"{name}.weight") == "readout"
        }

    @classmethod
    def mup_query_scale(cls, cfg: ModelConfig) -> float:
        """Under mup the logits are q.k sqrt(base key width)/(d_n + d_r), mup's 1/d over the key width; 1 while the
        key width does not grow (a fixed head dim)."""
        if not is_mup(cfg):
            return 1.0
        _, _, (_, _, dn0, dr0, _) = base_shapes(cfg)
        _, _, dn, dr, _ = mla_dims(cfg)
        return math.sqrt((dn0 + dr0) / (dn + dr))

    @classmethod
    def query_weights(cls, cfg: ModelConfig) -> tuple[str, ...]:
        return ("q_proj.weight", "q_proj.bias") if cfg.q_lora_rank is None else ("q_b_proj.weight",)

    @classmethod
    def remote_config(cls, cfg: ModelConfig) -> dict:
        return {k: getattr(cfg, k) for k in MLA_KEYS}

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        """The plain form's: H heads of keys d_n + d_r and values d_v (the cache holds the latent instead)."""
        _, _, dn, dr, dv = mla_dims(cfg)
        return Heads(query=cfg.n_heads, kv=cfg.n_heads, out=cfg.n_heads, value_dim=dv, key_dim=dn + dr)

    @classmethod
    def kv_cache_width(cls, cfg: ModelConfig) -> int:
        """c_KV and k^R: d_c + d_r per token and layer, whatever the head count."""
        _, dc, _, dr, _ = mla_dims(cfg)
        return dc + dr

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """W_Q (E x H(d_n + d_r)), or W_DQ (E x d_c'), its norm and W_UQ (d_c' x H(d_n + d_r)); W_DKV with W_KR
        (E x (d_c + d_r)), the c_KV norm (d_c), W_UKV (d_c x H(d_n + d_v)), W_O (H d_v x E); qkv_bias: biases on the
        two projections that read h."""
        dq, dc, dn, dr, dv = mla_dims(cfg)
        E, H = cfg.d_model, cfg.n_heads
        q = E * H * (dn + dr) if dq is None else E * dq + dq + dq * H * (dn + dr)
        kv = E * (dc + dr) + dc + dc * H * (dn + dv)
        bias = ((H * (dn + dr) if dq is None else dq) + dc + dr) * cfg.qkv_bias
        return q + kv + H * dv * E + bias

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Training runs the plain form: H heads, scores 2 T H (d_n + d_r) and values 2 T H d_v per layer forward, x3;
        on a GPU (every backend but eager) the values are zero-padded to the query width, as DeepSeek's flash path
        (`kernels.one_head_dim`), so the value matmul is 2 T H (d_n + d_r) wide whenever d_v < d_n + d_r."""
        _, _, dn, dr, dv = mla_dims(cfg)
        if cfg.attn_backend != "eager":
            dv = -(-dv // (dn + dr)) * (dn + dr)  # padded to a multiple of the query width
        return 3.0 * cfg.n_layers * 2 * seq_len * cfg.n_heads * (dn + dr + dv)
