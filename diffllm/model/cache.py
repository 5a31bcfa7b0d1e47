"""The KV cache for incremental decoding: every layer's keys and values of the tokens seen so far.

    cache = KVCache(max_len=256)
    logits = model(prompt, cache=cache)        # prefill: (B, P) -> (B, P, V); cache.pos = P
    logits = model(next_token, cache=cache)    # decode:  (B, 1) -> (B, 1, V); attends over all P + 1 positions

With document masks, pass doc_ids for the new tokens at every call (`model(tokens, cache, doc_ids=...)`): the cache
keeps the ids of the cached positions, so a decode step attends only within its own document.

Each attention variant stores what its own equations read again (Transformer and Diff V2: K and V of h_kv heads; Diff:
K1/K2 sub-heads of d and V heads of 2d), after rotary, so cached keys never need re-rotating. Storage is allocated
once per layer at the first call (max_len positions), then written in place.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import UserError


class LayerCache:
    """One layer's keys (B, Hk, max_len, dk) and values (B, Hv, max_len, dv), filled up to `cache.pos`."""

    def __init__(self, owner: KVCache):
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
        self.k[:, :, pos : pos + T] = k
        self.v[:, :, pos : pos + T] = v
        return self.k[:, :, : pos + T], self.v[:, :, : pos + T]


class KVCache:
    """Keys and values of every layer; `pos` is the position of the next token (= tokens cached so far). With document
    masks it also keeps the document id of every cached position (`doc_ids`, (B, max_len) long)."""

    def __init__(self, max_len: int):
        if max_len < 1:
            raise ValueError(f"KV cache: max_len must be positive, got {max_len}")
        self.max_len, self.pos = max_len, 0
        self.layers: list[LayerCache] = []
        self.doc_ids: Optional[torch.Tensor] = None

    def documents_so_far(self, doc_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Record the new tokens' document ids (B, T) at [pos, pos + T); returns those of all pos + T positions, (B, S).
        None when no call passes doc_ids; a cache is filled either with doc ids at every call or without at all."""
        if doc_ids is None:
            if self.doc_ids is not None:
                raise ValueError("KV cache: the cached tokens have doc_ids; pass doc_ids for the new tokens too")
            return None
        if self.doc_ids is None:
            if self.pos:
                raise ValueError(
                    f"KV cache: doc_ids given now but not for the {self.pos} cached tokens; pass doc_ids "
                    f"at every call or at none"
                )
            self.doc_ids = doc_ids.new_zeros(doc_ids.shape[0], self.max_len, dtype=torch.long)
        self.doc_ids[:, self.pos : self.pos + doc_ids.shape[1]] = doc_ids
        return self.doc_ids[:, : self.pos + doc_ids.shape[1]]

    def layer(self, i: int) -> LayerCache:
        while len(self.layers) <= i:
            self.layers.append(LayerCache(self))
        return self.layers[i]

    def check_room(self, new_tokens: int) -> None:
        if self.pos + new_tokens > self.max_len:
            raise UserError(
                f"KV cache full: {self.pos} cached + {new_tokens} new tokens > its max_len "
                f"{self.max_len} (model.max_seq_len bounds it; shorten the prompt or max_new_tokens)"
            )

    def advance(self, new_tokens: int) -> None:
        self.pos += new_tokens
