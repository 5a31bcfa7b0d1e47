"""The decoder-only LM: pre-norm blocks (the attention variant registered for `cfg.arch`, then SwiGLU)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .cache import KVCache, LayerCache
from .config import ModelConfig
from .layers import SwiGLU, build_norm, rotary_cos_sin


class Block(nn.Module):
    """Y = X + Attn(Norm(X));  X' = Y + SwiGLU(Norm(Y))."""

    def __init__(self, cfg: ModelConfig, depth: int, backend: Optional[str] = None):
        super().__init__()
        self.attn_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = cfg.variant(cfg, depth, backend)  # backend: None -> cfg.attn_backend
        self.mlp_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return x + self.mlp(self.mlp_norm(x))


class DecoderLM(nn.Module):
    """tokens (B, T) -> logits (B, T, padded_vocab). Knows nothing of parallelism, precision or checkpointing."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, depth) for depth in range(cfg.n_layers))
        self.norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) for every matrix and embedding (Diff V2's lambda_proj included), zero biases, unit norm
        weights, Diff's lambda vectors ~ N(0, lambda_std)."""
        for name, p in self.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("lambda_"):
                p.normal_(0.0, self.cfg.lambda_std)
            elif p.dim() >= 2:
                p.normal_(0.0, self.cfg.init_std)
            elif name.endswith("bias"):
                p.zero_()
            else:  # norm weights, the Diff subln weight
                p.fill_(1.0)

    def forward(self, tokens: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """tokens at positions [cache.pos, cache.pos + T) (from 0 without a cache)."""
        B, T = tokens.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if cache is not None:
            cache.check_room(T)
        x = self.tok_embeddings(tokens)  # (B, T, E)
        cos, sin = rotary_cos_sin(start + T, self.cfg.rotary_dim, self.cfg.rope_theta, x.device, x.dtype)
        cos, sin = cos[start:], sin[start:]  # (T, r/2): this call's positions
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i) if cache is not None else None)
        if cache is not None:
            cache.advance(T)
        return self.lm_head(self.norm(x))  # (B, T, V)
