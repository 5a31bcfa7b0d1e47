"""Differential attention (Ye et al. 2024), parameter-compatible with the official `MultiheadDiffAttn`.

    [Q1; Q2] = X W_Q,  [K1; K2] = X W_K,  V = X W_V          (2h sub-heads of d for Q, K; h heads of 2d for V)
    lambda   = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init  (fp32; one set per layer, shared by all heads)
    head_i   = (softmax(Q1 K1^T / sqrt d) - lambda softmax(Q2 K2^T / sqrt d)) V
    out      = W_O concat_i[(1 - lambda_init) RMSNorm(head_i)]  (one 2d RMSNorm weight shared by all heads)

Diff head i uses query sub-heads 2i, 2i+1 (adjacent). With GQA, diff head i reads kv group g = i // n_rep, i.e. key
sub-heads 2g, 2g+1 and value head g, as the official flash files do.

n_heads in the config is the Transformer's h: Diff runs h/2 diff heads of value width 2d (same d, same parameters
but for the lambda vectors and the subln weight). `DiffEquations.project` lays the sub-heads out component-major,
[Q1 heads..., Q2 heads...], so one standard call with 2h query heads sends component c of head i to component c of
its own group's keys (and V, tiled); `mix` subtracts. Backends: eager materialises both maps and multiplies
(P1 - lambda P2) V once; sdpa/flash make that one call on the CPU, V read by both components, and on a GPU four
calls of one head dim d, the official `multihead_flashdiff_2` (diffllm/model/kernels.py `one_head_dim`: each
component over each d-wide half of V, so SDPA runs its flash kernel); triton calls the fused kernel
`diffllm.model.triton_diff.fused_diff_attention` (one pass, one accumulator per map; its backward multiplies by V
once, like eager).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ..errors import UserError
from .config import ModelConfig
from .documents import Documents
from .layers import AttentionEquations, RMSNorm, heads_of
from .parametrization import is_mup
from .registry import register
from .variant import AttentionVariant, Heads


def _fused_diff_attention():
    """The Triton kernel, imported on first use (triton is an optional GPU extra)."""
    try:
        from .triton_diff import fused_diff_attention
    except ImportError as e:
        raise RuntimeError(
            f"attn_backend=triton needs the triton package (pip install triton) and a CUDA device "
            f"({e}); use attn_backend=sdpa here"
        ) from None
    return fused_diff_attention


class DiffEquations(AttentionEquations):
    """The equations above (torch only: shipped with the export). Reads `lambda_init` from the config: None for the
    paper's schedule, a float for a constant."""

    def __init__(self, cfg, depth):
        super().__init__(cfg, depth)
        self.n_heads = cfg.n_heads // 2  # h: diff heads
        self.n_kv_heads = (cfg.n_kv_heads or cfg.n_heads) // 2  # kv groups
        self.head_dim = cfg.d_model // cfg.n_heads  # d: each Q/K sub-head; V heads are 2d
        self.lambda_init = self.lambda_init_at(cfg, depth)  # a python float, as in the official code
        self.lambda_scale = 1.0  # the dot products' multiplier: 1 but under mup with lambda_mup_scale
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

    @staticmethod
    def lambda_init_at(cfg, depth: int) -> float:
        """lambda_init for the 0-based layer index `depth` (the paper's l-1): cfg.lambda_init when set, else the
        paper's 0.8 - 0.6 exp(-0.3 depth)."""
        if cfg.lambda_init is not None:
            return float(cfg.lambda_init)
        return 0.8 - 0.6 * math.exp(-0.3 * depth)

    def lambda_full(self) -> torch.Tensor:
        """Scalar lambda in fp32."""
        acc = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        l1 = torch.exp(torch.sum(self.lambda_q1.to(acc) * self.lambda_k1.to(acc)) * self.lambda_scale)
        l2 = torch.exp(torch.sum(self.lambda_q2.to(acc) * self.lambda_k2.to(acc)) * self.lambda_scale)
        return l1 - l2 + self.lambda_init

    def project(self, x, cos, sin):
        """q (B, 2h, T, d) = [Q1 heads..., Q2 heads...], k (B, 2g, T, d) likewise, v (B, g, T, 2d)."""
        h, g = self.n_heads, self.n_kv_heads
        q = self.rotated(self.q_proj, x, 2 * h, cos, sin)  # (B, T, 2h, d): diff head i = sub-heads 2i, 2i+1
        k = self.rotated(self.k_proj, x, 2 * g, cos, sin)  # (B, T, 2g, d)
        v = heads_of(self.v_proj(x), g).transpose(1, 2)  # (B, g, T, 2d)
        return self.component_major(q), self.component_major(k), v

    @staticmethod
    def component_major(t: torch.Tensor) -> torch.Tensor:
        """Adjacent sub-head pairs into components 1 and 2, component-major along the head axis:
        (B, T, 2n, d) -> (B, T, n, 2, d) -> (B, 2, n, T, d) -> (B, 2n, T, d)."""
        B, T, n2, d = t.shape
        return t.view(B, T, n2 // 2, 2, d).permute(0, 3, 2, 1, 4).reshape(B, n2, T, d)

    def mix(self, x, o):
        """o (B, 2h, T, *) -> o1 - lambda o2 (B, h, T, *)."""
        o = o.unflatten(1, (2, self.n_heads))  # (B, 2, h, T, *)
        return o[:, 0] - self.lambda_full().type_as(o) * o[:, 1]

    def finish(self, x, y):
        """y (B, h, T, 2d) -> W_O concat_i (1 - lambda_init) RMSNorm(y_i)."""
        return self.out_proj((self.subln(y) * (1.0 - self.lambda_init)).transpose(1, 2).reshape(x.shape))


lambda_init_at = DiffEquations.lambda_init_at


@register
class DiffAttention(AttentionVariant, DiffEquations):
    """Options (ModelConfig fields that only Diff reads): `lambda_init` (None: the paper's depth schedule; a float:
    that constant), `lambda_std` (init std of the four lambda vectors) and `lambda_mup_scale` (under mup: the lambda
    dot products x base_head_dim / d)."""

    arch, label, color = "diff", "Diff Transformer", "tab:red"
    map_normalisation = "(A1 - lambda A2) / (1 - lambda)"
    no_decay = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
    # W_Q, W_K, W_V, W_O; q/k/v biases, the four lambda vectors (d), the shared per-head RMSNorm weight (2d)
    mup = {"*_proj.weight": "hidden", "*_proj.bias": "vector", "lambda_*": "vector", "subln.weight": "vector"}

    def __init__(self, cfg: ModelConfig, depth: int, backend: Optional[str] = None):
        super().__init__(cfg, depth, backend)
        self.lambda_scale = self.mup_folds(cfg).get("lambda_q1", 1.0)

    def attend(self, x, q, k, v, docs: Optional[Documents]):
        """triton: the fused kernel on q (B, 2h, T, d), k (B, 2g, T, d), v (B, g, T, 2d) -> (B, h, T, 2d); its cached
        decode steps (Tq < Tk) and the other backends: the one standard call."""
        if self.backend == "triton" and q.shape[2] == k.shape[2]:
            return _fused_diff_attention()(q, k, v, self.lambda_full(), docs)
        return super().attend(x, q, k, v, docs)

    @torch.no_grad()
    def init_parameter(self, name: str, p: nn.Parameter, cfg: ModelConfig) -> None:
        """The lambda vectors ~ N(0, lambda_std); the rest as every other parameter."""
        if name.startswith("lambda_"):
            p.normal_(0.0, cfg.lambda_std)
        else:
            super().init_parameter(name, p, cfg)

    def report(self) -> dict[str, float]:
        """lambda: the rebuilt map is divided by 1 - lambda, large as lambda -> 1."""
        return {"lambda": float(self.lambda_full().detach())}

    def warning(self, key: str, value: float) -> Optional[str]:
        if value < 0:
            return f"lambda = {value:.4f} < 0 (the second attention map is now added, not subtracted)"
        return None

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.n_heads % 2 or cfg.kv_heads % 2:
            raise UserError(
                f"model.n_heads: diff needs even n_heads and n_kv_heads (got {cfg.n_heads}, {cfg.kv_heads})"
            )
        if not cfg.lambda_std >= 0:
            raise UserError(f"model.lambda_std: must be >= 0, got {cfg.lambda_std}")
        if not isinstance(cfg.lambda_mup_scale, bool):
            raise UserError(f"model.lambda_mup_scale: must be true or false, got {cfg.lambda_mup_scale!r}")

    @classmethod
    def mup_folds(cls, cfg: ModelConfig) -> dict[str, float]:
        """lambda_mup_scale under mup: lambda's dot products over the head dim d, times base_head_dim / d (mup's 1/d,
        as the logits'): an Adam step moves every coordinate by about the lr, so unscaled a dot product moves ~d times
        as far (docs/model.md). Folded into lambda_q1 and lambda_q2."""
        if not is_mup(cfg) or not cfg.lambda_mup_scale or cfg.base_head_dim is None:
            return {}
        scale = cfg.base_head_dim / cfg.head_dim
        return {} if scale == 1.0 else {"lambda_q1": scale, "lambda_q2": scale}

    @classmethod
    def remote_config(cls, cfg: ModelConfig) -> dict:
        return {"lambda_init": cfg.lambda_init}

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        d = cfg.head_dim  # each kv group caches its two key sub-heads of d and one value head of 2d
        return Heads(query=cfg.n_heads // 2, kv=cfg.kv_heads // 2, out=cfg.n_heads // 2, value_dim=2 * d, key_dim=2 * d)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """The Transformer's projections (2h sub-heads of d = E for Q, K; h heads of 2d for V) + 4 lambda vectors of
        d + the shared 2d subln weight."""
        E, d, kv = cfg.d_model, cfg.head_dim, cfg.kv_heads * cfg.head_dim
        return E * E + 2 * E * kv + E * E + (E + 2 * kv) * cfg.qkv_bias + 4 * d + 2 * d

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """The matmul work of the kernel that runs on a GPU, PaLM convention (backward = 2x forward). eager: both maps
        together are n_heads sub-heads of d (E wide), scores 2*T*E, and (P1 - lambda P2) multiplies V (E wide) once,
        2*T*E. sdpa and flash: four calls of one head dim, each component (h/2 query heads of d) over each d-wide
        half of V: scores 4 x T*E, values 4 x T*E (`kernels.one_head_dim`; tests/model/test_kernel_calls.py counts
        the recorded calls). The fused triton kernel: scores 2*T*E; its single-pass forward keeps one accumulator per
        map (each map's normaliser is known only at the end of its row), 4*T*E, while its backward works on the exact
        A = P1 - lambda P2, the Transformer's 2 x 2*T*E."""
        E, T = cfg.d_model, seq_len
        if cfg.attn_backend == "triton":
            return cfg.n_layers * (3.0 * 2 * T * E + 4 * T * E + 2.0 * 2 * T * E)
        if cfg.attn_backend == "eager":
            return 3.0 * cfg.n_layers * (2 * T * E + 2 * T * E)
        return 3.0 * cfg.n_layers * (4 * T * E + 4 * T * E)
