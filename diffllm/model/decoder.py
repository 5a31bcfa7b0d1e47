"""The decoder-only LM: pre-norm blocks (the attention variant registered for `cfg.arch`, then SwiGLU)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import nn

from ..errors import UserError
from .cache import KVCache, LayerCache
from .config import ModelConfig
from .documents import Documents
from .layers import SwiGLU, build_norm, rotary_cos_sin
from .loss import head_loss
from .parametrization import branch_scale, init_mult, is_mup, readout_scale, treatments, width_mult
from .variant import init_parameter


class Block(nn.Module):
    """Y = X + s Attn(Norm(X));  X' = Y + s SwiGLU(Norm(Y)), s = 1 but under completep base_depth / n_layers."""

    def __init__(self, cfg: ModelConfig, depth: int, backend: Optional[str] = None):
        super().__init__()
        self.attn_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = cfg.variant(cfg, depth, backend)  # backend: None -> cfg.attn_backend
        self.mlp_norm = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_hidden)
        self.branch_scale = branch_scale(cfg)  # CompleteP's 1/depth_mult (alpha = 1); 1 under sp and mup

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: Optional[LayerCache] = None,
        docs: Optional[Documents] = None,
    ) -> torch.Tensor:
        if self.branch_scale != 1.0:  # completep below or above its base depth
            x = x + self.branch_scale * self.attn(self.attn_norm(x), cos, sin, cache, docs=docs)  # (B, T, E)
            return x + self.branch_scale * self.mlp(self.mlp_norm(x))
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, docs=docs)  # every variant takes docs (registry.register)
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
        self.readout_scale = readout_scale(cfg)  # 1 but under mup: 1 / width_mult (mup's MuReadout)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every parameter in `named_parameters` order (a tied lm_head once, as the embedding): an attention module's
        by its variant's `init_parameter` (Diff: its lambda vectors ~ N(0, lambda_std)), the others N(0, init_std)
        for matrices and embeddings, zero biases, unit norm weights. One pass in that order keeps the random draws
        in the order of the parameters, whatever the variant. Under mup the hidden matrices' init_std is divided by
        sqrt(width_mult) (diffllm/model/parametrization.py)."""
        owner = {id(p): (layer.attn, n) for layer in self.layers for n, p in layer.attn.named_parameters()}
        hidden, kinds = self.cfg, {}
        if is_mup(self.cfg):
            kinds, m = treatments(self), width_mult(self.cfg)
            hidden = replace(self.cfg, init_std=self.cfg.init_std * init_mult("hidden", m)) if m != 1.0 else hidden
        for name, p in self.named_parameters():
            cfg = hidden if kinds.get(name) == "hidden" else self.cfg
            if id(p) in owner:
                attn, local = owner[id(p)]
                attn.init_parameter(local, p, cfg)
            else:
                init_parameter(name, p, cfg.init_std)

    def no_decay_parameters(self) -> list[nn.Parameter]:
        """The parameters each attention variant keeps from weight decay whatever their shape (Diff: its lambdas)."""
        return [getattr(layer.attn, name) for layer in self.layers for name in layer.attn.no_decay]

    def forward(
        self,
        tokens: torch.Tensor,
        cache: Optional[KVCache] = None,
        doc_ids: Optional[torch.Tensor] = None,
        restart_positions: bool = False,
        targets: Optional[torch.Tensor] = None,
        target_mask: Optional[torch.Tensor] = None,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """tokens at positions [cache.pos, cache.pos + T) (from 0 without a cache) -> logits (B, T, V); with `targets`
        (B, T) the 0-dim next-token loss instead (loss.py: `target_mask` (B, T) bool keeps the targets that count,
        `reduction` "mean" or "sum"), the logits never returned.
        doc_ids (B, T): the document ordinal of each token of packed rows (non-decreasing per row); a token then
        attends only to the tokens of its own document (documents.py), and with `restart_positions` its RoPE position
        is its index within its document. None: plain causal attention over the whole row."""
        B, T = tokens.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise UserError(f"sequence length {start + T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if doc_ids is not None and doc_ids.shape != tokens.shape:
            raise ValueError(f"doc_ids: want the tokens' shape {tuple(tokens.shape)}, got {tuple(doc_ids.shape)}")
        if restart_positions and doc_ids is None:
            raise ValueError("restart_positions needs doc_ids (the document of each token)")
        docs = None
        if cache is not None:
            cache.check_room(T)
            doc_ids = cache.documents_so_far(doc_ids)  # (B, start + T): the cached positions' ids first
        if doc_ids is not None:
            docs = Documents(doc_ids, n_queries=T, restart_positions=restart_positions)
        x = self.tok_embeddings(tokens)  # (B, T, E)
        cos, sin = rotary_cos_sin(start + T, self.cfg.rotary_dim, self.cfg.rope_theta, x.device, x.dtype)
        if restart_positions:
            cos, sin = cos[docs.positions], sin[docs.positions]  # (B, T, r/2): positions within each document
        else:
            cos, sin = cos[start:], sin[start:]  # (T, r/2): this call's positions
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i) if cache is not None else None, docs)
        if cache is not None:
            cache.advance(T)
        x = self.norm(x)  # (B, T, E)
        if targets is not None:
            return head_loss(self.lm_head, x, targets, target_mask, self.readout_scale, reduction)
        logits = self.lm_head(x)  # (B, T, V)
        return logits if self.readout_scale == 1.0 else logits * self.readout_scale
