"""The KV cache for incremental decoding: every layer's keys and values of the tokens seen so far.

    cache = KVCache(max_len=256)
    logits = model(prompt, cache=cache)        # prefill: (B, P) -> (B, P, V); cache.pos = P
    logits = model(next_token, cache=cache)    # decode:  (B, 1) -> (B, 1, V); attends over all P + 1 positions

Each attention variant stores what its own equations read again (Transformer and Diff V2: K and V of h_kv heads; Diff:
K1/K2 sub-heads of d and V heads of 2d), after rotary, so cached keys never need re-rotating. Storage is allocated
once per layer at the first call (max_len positions), then written in place.
"""
from __future__ import annotations

from typing import Optional

import torch


class LayerCache:
    """One layer's keys (B, Hk, max_len, dk) and values (B, Hv, max_len, dv), filled up to `cache.pos`."""

    def __init__(self, owner: "KVCache"):
        self.owner = owner
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' k: (B, Hk, T, dk), v: (B, Hv, T, dv); returns all cached (B, H*, pos + T, d*)."""
        pos, T = self.owner.pos, k.shape[2]
        if self.k is None:
            B, L = k.shape[0], self.owner.max_len
            self.k = k.new_empty(B, k.shape[1], L, k.shape[3])
            self.v = v.new_empty(B, v.shape[1], L, v.shape[3])
        self.k[:, :, pos: pos + T] = k
        self.v[:, :, pos: pos + T] = v
        return self.k[:, :, : pos + T], self.v[:, :, : pos + T]


class KVCache:
    """Keys and values of every layer; `pos` is the position of the next token (= tokens cached so far)."""

    def __init__(self, max_len: int):
        if max_len < 1:
            raise ValueError(f"KV cache: max_len must be positive, got {max_len}")
        self.max_len, self.pos = max_len, 0
        self.layers: list[LayerCache] = []

    def layer(self, i: int) -> LayerCache:
        while len(self.layers) <= i:
            self.layers.append(LayerCache(self))
        return self.layers[i]

    def check_room(self, new_tokens: int) -> None:
        if self.pos + new_tokens > self.max_len:
            raise ValueError(f"KV cache full: {self.pos} cached + {new_tokens} new tokens > its max_len "
                             f"{self.max_len} (model.max_seq_len bounds it; shorten the prompt or max_new_tokens)")

    def advance(self, new_tokens: int) -> None:
        self.pos += new_tokens
