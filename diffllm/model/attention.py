"""Causal attention kernels (eager | sdpa | flash, and the planner's "meta" stand-in) and the standard multi-head /
grouped-query attention module: the Transformer's variant (`arch: transformer`)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cache import LayerCache
from .config import ModelConfig
from .documents import Documents, causal_mask
from .layers import apply_rotary
from .remote import RemoteAttention, attend
from .variant import AttentionVariant, Heads, register
from ..errors import UserError

try:  # flash-attn is an optional GPU extra; it cannot be built on CPU machines.
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = flash_attn_varlen_func = None


def flash_available() -> bool:
    return flash_attn_func is not None and torch.cuda.is_available()


def causal_probs(q: torch.Tensor, k: torch.Tensor, docs: Optional[Documents] = None) -> torch.Tensor:
    """Materialised causal attention maps, softmax in fp32.
    q: (B, Hq, Tq, d), k: (B, Hkv, Tk, d) -> (B, Hq, Tq, Tk); query head h reads kv head h // (Hq/Hkv); the queries
    are the last Tq of the Tk positions (Tq = Tk without a KV cache). With `docs`, a query sees only the keys of its
    own document (docs.mask)."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)  # (B, Hq, Tk, d)
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32, or fp64 for float64 references
    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, Hq, Tq, Tk)
    hidden = causal_mask(q.shape[2], k.shape[2], q.device) if docs is None else ~docs.mask  # (Tq, Tk) | (B, 1, Tq, Tk)
    return scores.masked_fill(hidden, float("-inf")).softmax(dim=-1).type_as(q)


class _MetaFlash(torch.autograd.Function):
    """The planner's "meta" kernel: outputs of the right shape and saves what FlashAttention-2 keeps for backward
    (q, k, v, out and the fp32 log-sum-exp), so activations can be counted on the meta device, where SDPA would
    trace its math path with T x T maps. Forward only: its backward is never run."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        B, H, T, _ = q.shape
        out = q.new_empty(B, T, H, v.shape[-1]).transpose(1, 2)  # flash kernels write (B, T, H, d): views follow
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        raise NotImplementedError("the meta attention kernel only measures saved tensors")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str,
                     docs: Optional[Documents] = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal) v with GQA (query head h reads kv head h // (Hq/Hkv)).
    q: (B, Hq, Tq, d), k: (B, Hkv, Tk, d); v: (B, Hkv, Tk, dv) with dv free to differ from d -> (B, Hq, Tq, dv);
    Tq < Tk after a KV cache (the queries are the last Tq positions). With `docs` (packed rows), a query attends
    only within its own document: the dense docs.mask for eager/sdpa, docs.varlen() segments for flash.
    "triton" runs sdpa here: only Diff has a fused kernel, every other call is one standard attention already."""
    n_rep = q.shape[1] // k.shape[1]
    if backend == "eager":
        return causal_probs(q, k, docs) @ v.repeat_interleave(n_rep, dim=1)
    if backend == "meta":
        return _MetaFlash.apply(q, k, v)
    if docs is not None and (q.shape[2] != k.shape[2] or backend in ("sdpa", "triton")):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.mask, enable_gqa=n_rep > 1)  # (B, 1, Tq, Tk)
    if q.shape[2] != k.shape[2]:  # queries after a KV cache: sdpa with the bottom-right causal mask, any backend
        mask = None if q.shape[2] == 1 else ~causal_mask(q.shape[2], k.shape[2], q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
    if backend in ("sdpa", "triton"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
    if backend == "flash":
        if not flash_available():
            raise RuntimeError("attn_backend=flash needs flash-attn and a CUDA device; use attn_backend=sdpa here")
        # flash-attn wants (B, T, H, d) and one head dim for q, k and v: split a wider v into d-sized slices.
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        outs = [_flash(qt, kt, vs.transpose(1, 2), docs) for vs in v.split(q.shape[-1], dim=-1)]
        return torch.cat(outs, dim=-1).transpose(1, 2)
    raise UserError(f"unknown attention backend {backend!r}")


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Optional[Documents]) -> torch.Tensor:
    """One flash-attn call on (B, T, H*, d) tensors -> (B, T, Hq, d): flash_attn_func, or with `docs` the varlen
    kernel over the flattened (B * T) tokens, one causal segment per document."""
    if docs is None:
        return flash_attn_func(q, k, v, causal=True)
    B, T = q.shape[:2]
    cu_seqlens, max_len = docs.varlen()  # (n_docs + 1,) int32
    out = flash_attn_varlen_func(q.reshape(B * T, *q.shape[2:]), k.reshape(B * T, *k.shape[2:]),
                                 v.reshape(B * T, *v.shape[2:]), cu_seqlens, cu_seqlens, max_len, max_len,
                                 causal=True)  # (B * T, Hq, d)
    return out.view(B, T, *out.shape[1:])


class TransformerRemote(RemoteAttention):
    """The format=remote export's attention (diffllm/model/remote.py): softmax(Q K^T / sqrt d + mask) V, GQA."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, config.n_heads, config.n_kv_heads, config.d_model // config.n_heads)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        q, k, v = self.qkv(x, cos, sin)
        k, v = self.cached(k.transpose(1, 2), v.view(B, T, -1, self.d).transpose(1, 2), cache)  # (B, Hkv, S, d)
        y = attend(q.transpose(1, 2), k, v, mask)  # (B, H, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))


def heads_of(t: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """(B, T, n * d) -> (B, T, n, d)."""
    B, T, _ = t.shape
    return t.view(B, T, n, d)


@register
class Attention(AttentionVariant):
    """Standard causal self-attention: n_heads query heads and n_kv_heads kv heads of dim d = d_model / n_heads."""

    arch, label, color, baseline = "transformer", "Transformer", "tab:blue", True
    remote = TransformerRemote

    def __init__(self, cfg: ModelConfig, depth: int, backend: str | None = None):
        super().__init__(cfg, depth, backend)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.interleaved = cfg.rope_interleaved
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerCache] = None, docs: Optional[Documents] = None) -> torch.Tensor:
        B, T, E = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, d)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, d)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, d)
        q, k = apply_rotary(q, cos, sin, self.interleaved), apply_rotary(k, cos, sin, self.interleaved)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H*, T, d)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, Hkv, pos + T, d)
        y = causal_attention(q, k, v, self.backend, docs)  # (B, H, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))

    def map_parts(self, x, cos, sin):
        """[(q (B, H, T, d), k (B, H, T, d))] in fp32, kv heads repeated to the query heads; one map. Doc-unaware:
        eval attention rebuilds causal maps over whole windows (no document masks)."""
        q = apply_rotary(heads_of(self.q_proj(x), self.n_heads, self.head_dim), cos, sin, self.interleaved)
        k = apply_rotary(heads_of(self.k_proj(x), self.n_kv_heads, self.head_dim), cos, sin, self.interleaved)
        rep = self.n_heads // self.n_kv_heads
        return [(q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(rep, dim=1))], None

    def output_from_maps(self, x, maps, lam):
        B, T, E = x.shape
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2).float()  # (B, Hkv, T, d)
        y = maps[0] @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, H, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E).to(x.dtype))

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        return Heads(query=cfg.n_heads, kv=cfg.kv_heads, out=cfg.n_heads, value_dim=cfg.head_dim)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        E, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
        return E * E + 2 * E * kv + E * E + (E + 2 * kv) * cfg.qkv_bias  # W_Q, W_K, W_V, W_O (+ q/k/v biases)

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Scores 2*T*E + values 2*T*E per layer forward (h heads of d = E), x3 for fwd + bwd."""
        return 3.0 * cfg.n_layers * (2 * seq_len * cfg.d_model + 2 * seq_len * cfg.d_model)
