"""Differential attention (Ye et al. 2024), parameter-compatible with the official `MultiheadDiffAttn`.

    [Q1; Q2] = X W_Q,  [K1; K2] = X W_K,  V = X W_V          (2h sub-heads of d for Q, K; h heads of 2d for V)
    lambda   = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init  (fp32; one set per layer, shared by all heads)
    head_i   = (softmax(Q1 K1^T / sqrt d) - lambda softmax(Q2 K2^T / sqrt d)) V
    out      = W_O concat_i[(1 - lambda_init) RMSNorm(head_i)]  (one 2d RMSNorm weight shared by all heads)

Diff head i uses query sub-heads 2i, 2i+1 (adjacent). With GQA, diff head i reads kv group g = i // n_rep, i.e. key
sub-heads 2g, 2g+1 and value head g, as the official flash files do.

n_heads in the config is the Transformer's h: Diff runs h/2 diff heads of value width 2d (same d, same parameters
but for the lambda vectors and the subln weight). Backends: eager materialises both maps and multiplies
(P1 - lambda P2) V once; sdpa/flash make one standard call with 2h query heads and V twice; triton calls the fused
kernel `diffllm.model.triton_diff.fused_diff_attention` (one pass, one accumulator per map; its backward multiplies
by V once, like eager).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .attention import causal_attention, causal_probs, heads_of
from .cache import LayerCache
from .config import ModelConfig
from .documents import Documents
from .layers import RMSNorm, apply_rotary
from .remote import RemoteAttention, attend
from .variant import AttentionVariant, Heads, register
from ..errors import UserError


def _fused_diff_attention():
    """The Triton kernel, imported on first use (triton is an optional GPU extra)."""
    try:
        from .triton_diff import fused_diff_attention
    except ImportError as e:
        raise RuntimeError(f"attn_backend=triton needs the triton package (pip install triton) and a CUDA device "
                           f"({e}); use attn_backend=sdpa here") from None
    return fused_diff_attention


def lambda_init_at(cfg: ModelConfig, depth: int) -> float:
    """lambda_init for the 0-based layer index `depth` (the paper's l-1): model.lambda_init when set, else the
    paper's 0.8 - 0.6 exp(-0.3 depth)."""
    if cfg.lambda_init is not None:
        return float(cfg.lambda_init)
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


class DiffRemote(RemoteAttention):
    """The format=remote export's Diff attention (diffllm/model/remote.py): one attend call for both maps, then
    (1 - lambda_init) RMSNorm(A1 V - lambda A2 V); config.lambda_inits holds each layer's lambda_init."""

    def __init__(self, config, layer_idx):
        d = config.d_model // config.n_heads
        super().__init__(config, layer_idx, config.n_heads, config.n_kv_heads, d)
        self.h, self.g = config.n_heads // 2, config.n_kv_heads // 2  # diff heads, kv groups
        self.lambda_init = float(config.lambda_inits[layer_idx])
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(d, dtype=torch.float32)) for _ in range(4))
        self.subln = RMSNorm(2 * d, eps=1e-5)

    def reset_extra(self):
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            p.data.normal_(0.0, 0.1)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        h, g, d = self.h, self.g, self.d
        q, k, v = self.qkv(x, cos, sin)  # (B, T, 2h, d), (B, T, 2g, d), (B, T, 2g*d)
        # adjacent sub-head pairs -> component-major heads [map 1 heads..., map 2 heads...]
        q = q.view(B, T, h, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * h, T, d)
        k = k.view(B, T, g, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * g, T, d)
        k, v = self.cached(k, v.view(B, T, g, 2 * d).transpose(1, 2), cache)  # (B, 2g, S, d), (B, g, S, 2d)
        l1 = torch.exp(torch.sum(self.lambda_q1.float() * self.lambda_k1.float()))
        l2 = torch.exp(torch.sum(self.lambda_q2.float() * self.lambda_k2.float()))
        lam = (l1 - l2 + self.lambda_init).type_as(q)
        # query head c*h + i reads kv head c*g + i // (h/g): the component-c keys of its group; both read the same V
        out = attend(q, k, torch.cat([v, v], dim=1), mask).view(B, 2, h, T, 2 * d)
        attn = self.subln(out[:, 0] - lam * out[:, 1]) * (1.0 - self.lambda_init)  # (B, h, T, 2d)
        return self.out_proj(attn.transpose(1, 2).reshape(B, T, E))


@register
class DiffAttention(AttentionVariant):
    """Options (ModelConfig fields that only Diff reads): `lambda_init` (None: the paper's depth schedule; a float:
    that constant) and `lambda_std` (init std of the four lambda vectors)."""

    arch, label, color = "diff", "Diff Transformer", "tab:red"
    map_normalisation = "(A1 - lambda A2) / (1 - lambda)"
    remote = DiffRemote

    def __init__(self, cfg: ModelConfig, depth: int, backend: str | None = None):
        super().__init__(cfg, depth, backend)
        self.n_heads = cfg.n_heads // 2  # h: diff heads
        self.n_kv_heads = cfg.kv_heads // 2  # kv groups
        self.head_dim = cfg.head_dim  # d: each Q/K sub-head; V heads are 2d
        self.interleaved = cfg.rope_interleaved
        self.lambda_init = lambda_init_at(cfg, depth)  # a python float, as in the official code
        kv_dim = 2 * self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
        self.subln = RMSNorm(2 * self.head_dim, eps=1e-5)

    def lambda_full(self) -> torch.Tensor:
        """Scalar lambda in fp32."""
        acc = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp(torch.sum(self.lambda_q1.to(acc) * self.lambda_k1.to(acc)))
        l2 = torch.exp(torch.sum(self.lambda_q2.to(acc) * self.lambda_k2.to(acc)))
        return l1 - l2 + self.lambda_init

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerCache] = None, docs: Optional[Documents] = None) -> torch.Tensor:
        """docs: both maps see only the keys of each query's own document (packed rows)."""
        B, T, E = x.shape
        h, g, d = self.n_heads, self.n_kv_heads, self.head_dim
        q = apply_rotary(self.q_proj(x).view(B, T, 2 * h, d), cos, sin, self.interleaved)  # (B, T, 2h, d)
        k = apply_rotary(self.k_proj(x).view(B, T, 2 * g, d), cos, sin, self.interleaved)  # (B, T, 2g, d)
        v = self.v_proj(x).view(B, T, g, 2 * d).transpose(1, 2)  # (B, g, T, 2d)
        # Split the adjacent sub-head pairs into components 1 and 2, component-major along the head axis:
        # (B, T, 2h, d) -> (B, T, h, 2, d) -> (B, 2, h, T, d) -> (B, 2h, T, d) = [Q1 heads..., Q2 heads...].
        q = q.view(B, T, h, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * h, T, d)
        k = k.view(B, T, g, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * g, T, d)
        if cache is not None:
            k, v = cache.update(k, v)  # cached K1/K2 (B, 2g, S, d) and V (B, g, S, 2d), S = pos + T
        S = k.shape[2]
        lam = self.lambda_full().type_as(q)
        if self.backend == "eager":
            probs = causal_probs(q, k, docs).view(B, 2, h, T, S)  # materialised maps, the reference path
            attn = (probs[:, 0] - lam * probs[:, 1]) @ v.repeat_interleave(h // g, dim=1)  # (B, h, T, 2d)
        elif self.backend == "triton" and S == T:  # the fused kernel: (B, 2h, T, d), (B, 2g, T, d), (B, g, T, 2d)
            attn = _fused_diff_attention()(q, k, v, self.lambda_full(), docs)  # -> (B, h, T, 2d)
        else:
            # One kernel call: query head c*h + i reads kv head (c*h + i) // (h/g) = c*g + i // (h/g), i.e. the
            # component-c keys of its own group; both components read the same V. (Also the cached decode step of
            # the triton backend, whose kernel is written for T = S.)
            out = causal_attention(q, k, torch.cat([v, v], dim=1), self.backend, docs).view(B, 2, h, T, 2 * d)
            attn = out[:, 0] - lam * out[:, 1]  # (B, h, T, 2d)
        attn = self.subln(attn) * (1.0 - self.lambda_init)
        return self.out_proj(attn.transpose(1, 2).reshape(B, T, E))

    @torch.no_grad()
    def init_parameter(self, name: str, p: nn.Parameter, cfg: ModelConfig) -> None:
        """The lambda vectors ~ N(0, lambda_std); the rest as every other parameter."""
        if name.startswith("lambda_"):
            p.normal_(0.0, cfg.lambda_std)
        else:
            super().init_parameter(name, p, cfg)

    def map_parts(self, x, cos, sin):
        """[(q1, k1), (q2, k2)], each (B, h, T, d) in fp32 (diff head i: sub-heads 2i, 2i+1; kv group i // (h/g)),
        and the layer's lambda. Doc-unaware: eval attention rebuilds causal maps over whole windows."""
        h, g, d = self.n_heads, self.n_kv_heads, self.head_dim
        q = apply_rotary(heads_of(self.q_proj(x), 2 * h, d), cos, sin, self.interleaved)  # (B, T, 2h, d)
        k = apply_rotary(heads_of(self.k_proj(x), 2 * g, d), cos, sin, self.interleaved)  # (B, T, 2g, d)
        B, T = x.shape[:2]
        q, k = q.view(B, T, h, 2, d), k.view(B, T, g, 2, d)
        pairs = [(q[:, :, :, c].transpose(1, 2).float(),
                  k[:, :, :, c].transpose(1, 2).float().repeat_interleave(h // g, 1)) for c in (0, 1)]
        return pairs, self.lambda_full().detach().float()

    def output_from_maps(self, x, maps, lam):
        B, T, E = x.shape
        v = self.v_proj(x).view(B, T, self.n_kv_heads, 2 * self.head_dim).transpose(1, 2).float()  # (B, g, T, 2d)
        y = (maps[0] - lam * maps[1]) @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, h, T, 2d)
        y = self.subln(y) * (1.0 - self.lambda_init)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))

    def report(self) -> dict[str, float]:
        """lambda: the rebuilt map is divided by 1 - lambda, large as lambda -> 1."""
        return {"lambda": float(self.lambda_full().detach())}

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.n_heads % 2 or cfg.kv_heads % 2:
            raise UserError(f"model.n_heads: diff needs even n_heads and n_kv_heads (got {cfg.n_heads}, "
                             f"{cfg.kv_heads})")
        if not cfg.lambda_std >= 0:
            raise UserError(f"model.lambda_std: must be >= 0, got {cfg.lambda_std}")

    @classmethod
    def remote_config(cls, cfg: ModelConfig) -> dict:
        return {"lambda_inits": [lambda_init_at(cfg, i) for i in range(cfg.n_layers)]}

    @classmethod
    def from_remote_config(cls, cfg: ModelConfig, hf_cfg) -> None:
        """lambda_inits: diffllm's schedule (model.lambda_init null) or one constant."""
        inits = getattr(hf_cfg, "lambda_inits", None)
        if inits and any(abs(a - lambda_init_at(cfg, i)) > 0 for i, a in enumerate(inits)):
            if len(set(inits)) != 1:
                raise UserError(f"remote: config.json lambda_inits={inits} is neither diffllm's schedule nor a "
                                 f"constant")
            cfg.lambda_init = float(inits[0])

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        return Heads(query=cfg.n_heads // 2, kv=cfg.kv_heads // 2, out=cfg.n_heads // 2, value_dim=2 * cfg.head_dim)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """The Transformer's projections (2h sub-heads of d = E for Q, K; h heads of 2d for V) + 4 lambda vectors of
        d + the shared 2d subln weight."""
        E, d, kv = cfg.d_model, cfg.head_dim, cfg.kv_heads * cfg.head_dim
        return E * E + 2 * E * kv + E * E + (E + 2 * kv) * cfg.qkv_bias + 4 * d + 2 * d

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """The matmul work of the kernel that runs, PaLM convention (backward = 2x forward). Scores: both maps
        together are n_heads sub-heads of d (E wide): 2*T*E. Values (V is h/2 heads of 2d = E wide): eager
        multiplies the materialised (P1 - lambda P2) by V once, 2*T*E, forward and backward; sdpa and flash multiply
        each map by V, 4*T*E, forward and backward; the fused triton kernel's single-pass forward keeps one
        accumulator per map (each map's normaliser is known only at the end of its row), 4*T*E, while its backward
        works on the exact A = P1 - lambda P2, the Transformer's 2 x 2*T*E."""
        E, T = cfg.d_model, seq_len
        scores = 2 * T * E
        if cfg.attn_backend == "triton":
            return cfg.n_layers * (3.0 * scores + 4 * T * E + 2.0 * 2 * T * E)
        values = 2 * T * E if cfg.attn_backend == "eager" else 4 * T * E
        return 3.0 * cfg.n_layers * (scores + values)
