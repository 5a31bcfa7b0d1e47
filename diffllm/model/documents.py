"""Document masks for packed windows: which keys each query may attend to when one row holds several documents.

A packed row carries a document ordinal per position, non-decreasing, e.g. ids = [0 0 0 1 1 2 2 2]. Query i may
attend to key j iff j is causally visible (j <= i, bottom-right aligned after a KV cache) and ids[j] == ids[i]:

    mask[b, 0, i, j] = (j <= S - Tq + i) and ids[b, S - Tq + i] == ids[b, j]     (True = may attend, as SDPA's)

Every backend reads the same facts from one `Documents`, built once per forward: the dense bool mask (eager, and SDPA
on the CPU and after a KV cache), the flex-attention `block_mask` (every GPU kernel but Diff's fused one: tiles of
128 x 128 positions, empty where query and key tiles share no document, full where one document covers both, the
rest masked element by element; no T x T tensor anywhere), the per-position document starts and ends (the fused
Triton kernel), and the RoPE positions (restarting at 0 in each document, or the plain index). Each is computed on
first use and kept, without a lock, so `torch.compile` traces them with no graph break. This file is the one place
that builds attention masks, the plain causal one and the exported model's padded one included; every mask here means
what SDPA's does: True = may attend. Torch only: a `format=remote` export ships it verbatim
(`diffllm_documents_<h>.py`).
"""

from __future__ import annotations

from typing import Optional

import torch

FLEX_BLOCK = 128  # flex attention's sparse tile (its default): the GPU kernels' tiles divide it


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


class once:
    """A property computed on first use and kept in the instance (functools.cached_property without the lock that
    Python 3.11 takes, which torch.compile cannot trace)."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def document_block_mask(ids: torch.Tensor, block: int = FLEX_BLOCK):
    """The flex-attention BlockMask of causal attention within documents, for every position a query: ids (B, S)
    non-decreasing document ordinals. Built from the first and last document of each tile of `block` positions, so
    its cost is (S / block)^2 per row, never S^2: query tile a and key tile b (b <= a) share a document iff the key
    tile's last document >= the query tile's first; the tile is full (no element mask) iff b < a and one document runs
    from the key tile's start to the query tile's end, the query tile complete; partial tiles apply `mask_mod`."""
    from torch.nn.attention.flex_attention import BlockMask

    B, S = ids.shape
    n = -(-S // block)
    tile = torch.arange(n, device=ids.device)
    first = ids[:, tile * block]  # (B, n): the document of each tile's first position
    last = ids[:, (tile * block + block - 1).clamp(max=S - 1)]  # (B, n): ... of its last
    a, b = tile[:, None], tile[None, :]  # query tile a, key tile b: (n, n) [a, b] when combined
    shared = (b <= a) & (last[:, None, :] >= first[:, :, None])  # (B, n, n) [row, a, b]
    complete = a * block + block <= S  # (n, 1): query tiles of `block` positions
    full = (b < a) & complete & (first[:, None, :] == last[:, :, None])  # (B, n, n)
    partial = shared & ~full

    def ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, n, n) bool -> per query tile the count (B, 1, n) and the key tile indices (B, 1, n, n) of the marked
        tiles, marked first (flex's kv_num_blocks, kv_indices)."""
        marked = tiles.to(torch.int32)[:, None]
        return marked.sum(-1, dtype=torch.int32), marked.argsort(dim=-1, descending=True, stable=True).to(torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (ids[b, q_idx] == ids[b, kv_idx])

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(S, S)
    )


class Documents:
    """The documents of a batch of packed rows, for one forward pass.

    ids: (B, S) long document ordinal of every key position, non-decreasing along each row (the cached positions of a
    KV cache first); the queries are the last `n_queries` positions (default S). With `restart_positions` the RoPE
    position of a token is its index within its document, else its index in the row. Everything is computed on first
    use and kept (`once`)."""

    def __init__(self, ids: torch.Tensor, n_queries: Optional[int] = None, restart_positions: bool = False):
        if ids.dim() != 2:
            raise ValueError(f"doc_ids: want (B, S) document ids, got shape {tuple(ids.shape)}")
        self.ids = ids.long()  # (B, S)
        self.n_queries = ids.shape[1] if n_queries is None else n_queries
        if not 0 < self.n_queries <= ids.shape[1]:
            raise ValueError(f"Documents: n_queries={n_queries} must be in [1, {ids.shape[1]}] (the key positions)")
        self.restart_positions = restart_positions

    @once
    def mask(self) -> torch.Tensor:
        """(B, 1, Tq, S) bool, True = may attend: same document and causal (bottom-right aligned)."""
        Tq, S = self.n_queries, self.ids.shape[1]
        same = self.ids[:, S - Tq :, None] == self.ids[:, None, :]  # (B, Tq, S)
        return (same & causal_mask(Tq, S, self.ids.device))[:, None]

    @once
    def starts(self) -> torch.Tensor:
        """(B, S) int32: the index of the first token of each position's document."""
        return torch.searchsorted(self.ids.contiguous(), self.ids.contiguous(), out_int32=True)

    @once
    def ends(self) -> torch.Tensor:
        """(B, S) int32: one past the index of the last token of each position's document."""
        return torch.searchsorted(self.ids.contiguous(), self.ids.contiguous(), right=True, out_int32=True)

    @once
    def positions(self) -> torch.Tensor:
        """(B, Tq) long RoPE positions of the queries: index - start of its document with restart_positions, else
        the index itself."""
        B, S = self.ids.shape
        index = torch.arange(S, device=self.ids.device).expand(B, S)  # (B, S)
        pos = index - self.starts if self.restart_positions else index
        return pos[:, S - self.n_queries :]

    @once
    def block_mask(self):
        """flex attention's BlockMask of these documents (`document_block_mask`); only without a KV cache (Tq = S)."""
        if self.n_queries != self.ids.shape[1]:
            raise ValueError("Documents.block_mask: needs the queries at every key position (no KV cache)")
        return document_block_mask(self.ids)
