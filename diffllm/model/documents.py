"""Document masks for packed windows: which keys each query may attend to when one row holds several documents.

A packed row carries a document ordinal per position, non-decreasing, e.g. ids = [0 0 0 1 1 2 2 2]. Query i may
attend to key j iff j is causally visible (j <= i, bottom-right aligned after a KV cache) and ids[j] == ids[i]:

    mask[b, 0, i, j] = (j <= S - Tq + i) and ids[b, S - Tq + i] == ids[b, j]     (True = may attend, as SDPA's)

Every backend reads the same facts from one `Documents`, built once per forward: the dense bool mask (eager, sdpa),
`varlen()` segments (flash-attn's varlen kernel), the per-position document starts and ends (the fused Triton
kernel), and the RoPE positions (restarting at 0 in each document, or the plain index). This file is the one place
that builds attention masks, the plain causal one and the exported model's padded one included; every mask here means
what SDPA's does: True = may attend. Torch only: a `format=remote` export ships it verbatim
(`diffllm_documents_<h>.py`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Optional

import torch


def causal_mask(t_q: int, t_k: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """(t_q, t_k) bool, True where query i (the last t_q of t_k positions: a cached decode step) may see key j:
    j <= t_k - t_q + i."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q)


def padded_causal_mask(keys_ok: torch.Tensor, t_q: int) -> torch.Tensor:
    """(B, 1, t_q, S) bool for the last t_q of S positions, keys_ok (B, S) marking the real tokens (left padding
    False): causal and real keys only, and a query always sees itself (a padding query's row is never empty)."""
    S = keys_ok.shape[1]
    causal = causal_mask(t_q, S, keys_ok.device)  # (Tq, S)
    index = torch.arange(S, device=keys_ok.device)
    itself = index[None, :] == index[S - t_q :, None]  # (Tq, S): key j is query i's own position
    return ((causal & keys_ok[:, None, :]) | itself)[:, None]


def doc_ids_from_eos(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) tokens -> (B, T) long document ids: the number of EOS tokens strictly before each position, so an EOS
    belongs to the document it ends (torchtitan's rule)."""
    eos = (tokens == eos_id).long()
    return eos.cumsum(dim=1) - eos


class Documents:
    """The documents of a batch of packed rows, for one forward pass.

    ids: (B, S) long document ordinal of every key position, non-decreasing along each row (the cached positions of a
    KV cache first); the queries are the last `n_queries` positions (default S). With `restart_positions` the RoPE
    position of a token is its index within its document, else its index in the row. Everything is computed on first
    use and kept."""

    def __init__(self, ids: torch.Tensor, n_queries: Optional[int] = None, restart_positions: bool = False):
        if ids.dim() != 2:
            raise ValueError(f"doc_ids: want (B, S) document ids, got shape {tuple(ids.shape)}")
        self.ids = ids.long()  # (B, S)
        self.n_queries = ids.shape[1] if n_queries is None else n_queries
        if not 0 < self.n_queries <= ids.shape[1]:
            raise ValueError(f"Documents: n_queries={n_queries} must be in [1, {ids.shape[1]}] (the key positions)")
        self.restart_positions = restart_positions

    @cached_property
    def mask(self) -> torch.Tensor:
        """(B, 1, Tq, S) bool, True = may attend: same document and causal (bottom-right aligned)."""
        Tq, S = self.n_queries, self.ids.shape[1]
        same = self.ids[:, S - Tq :, None] == self.ids[:, None, :]  # (B, Tq, S)
        return (same & causal_mask(Tq, S, self.ids.device))[:, None]

    @cached_property
    def starts(self) -> torch.Tensor:
        """(B, S) int32: the index of the first token of each position's document."""
        return torch.searchsorted(self.ids.contiguous(), self.ids.contiguous(), out_int32=True)

    @cached_property
    def ends(self) -> torch.Tensor:
        """(B, S) int32: one past the index of the last token of each position's document."""
        return torch.searchsorted(self.ids.contiguous(), self.ids.contiguous(), right=True, out_int32=True)

    @cached_property
    def positions(self) -> torch.Tensor:
        """(B, Tq) long RoPE positions of the queries: index - start of its document with restart_positions, else
        the index itself."""
        B, S = self.ids.shape
        index = torch.arange(S, device=self.ids.device).expand(B, S)  # (B, S)
        pos = index - self.starts if self.restart_positions else index
        return pos[:, S - self.n_queries :]

    def varlen(self) -> tuple[torch.Tensor, int]:
        """(cu_seqlens int32 (n_docs + 1,), max_seqlen) of the documents over the flattened (B * S) tokens, for
        flash_attn_varlen_func; a document never spans two rows. Only without a KV cache (Tq = S)."""
        if self.n_queries != self.ids.shape[1]:
            raise ValueError("Documents.varlen: needs the queries at every key position (no KV cache)")
        return self._varlen

    @cached_property
    def _varlen(self) -> tuple[torch.Tensor, int]:
        B, S = self.ids.shape
        first = self.starts == torch.arange(S, device=self.ids.device)  # (B, S): a document starts here
        begins = first.flatten().nonzero().flatten().to(torch.int32)  # (n_docs,) in the flattened rows
        cu_seqlens = torch.cat([begins, begins.new_tensor([B * S])])  # (n_docs + 1,)
        return cu_seqlens, int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
