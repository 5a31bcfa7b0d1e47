"""Parameter counts, training FLOPs per token and weight memory, from a model built on the meta device. torch loads
when a count is asked for, not on import (configs and `--help` import this module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import ModelConfig

if TYPE_CHECKING:
    from .decoder import DecoderLM


@dataclass(frozen=True)
class ModelStats:
    total_params: int  # every unique parameter (a tied embedding counts once)
    embedding_params: int  # the input embedding table
    nonembedding_params: int  # total - input embedding (the output head counts: it is a matmul)
    matmul_params: int  # weights that multiply activations (all 2-D weights but the embedding lookup)
    flops_per_token: float  # training (fwd + bwd) FLOPs per token at seq_len
    seq_len: int
    kv_bytes_per_token: int = 0  # the KV cache of one token, all layers, bf16 (kv_cache_bytes_per_token)

    @property
    def bf16_weight_bytes(self) -> int:
        return 2 * self.total_params


def meta_model(cfg: ModelConfig) -> DecoderLM:
    """The model with shapes only: any size builds in milliseconds."""
    import torch

    from .decoder import DecoderLM

    with torch.device("meta"):
        return DecoderLM(cfg)


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward+backward FLOPs of the score and value matmuls per token, PaLM convention (no causal halving), as the
    variant counts them for the kernel cfg.attn_backend runs (see each variant's `attention_flops_per_token`)."""
    return cfg.variant.attention_flops_per_token(cfg, seq_len)


def kv_cache_bytes_per_token(cfg: ModelConfig, bytes_per_number: int = 2) -> int:
    """Bytes the KV cache holds per token over all layers (bf16 by default), from the variant's own declaration
    (`kv_cache_width`: Transformer 2 g d per layer, Diff 2 (g/2) 2d, V2 2 g d, ...)."""
    return cfg.n_layers * cfg.variant.kv_cache_width(cfg) * bytes_per_number


def model_stats(cfg: ModelConfig, seq_len: int | None = None) -> ModelStats:
    """Counts from the model built on the meta device; FLOPs = 6 x matmul params + the variant's attention FLOPs
    (for cfg.attn_backend)."""
    seq_len = seq_len or cfg.max_seq_len
    model = meta_model(cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.tok_embeddings.weight.numel()
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n != "tok_embeddings.weight")
    if cfg.tie_embeddings:  # the shared table is also the output matmul
        matmul += embedding
    flops = 6.0 * matmul + attention_flops_per_token(cfg, seq_len)
    return ModelStats(total, embedding, total - embedding, matmul, flops, seq_len, kv_cache_bytes_per_token(cfg))
