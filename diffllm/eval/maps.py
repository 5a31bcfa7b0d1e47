"""Attention maps and logits rebuilt in fp32 from each attention module's own projections, whatever kernel the model
runs (sdpa/flash never materialise them). Forward pre-hooks capture each attention module's input (x, cos, sin);
nothing of the model is patched.

The attention variant (diffllm/model/variant.py) says how: `map_parts(x, cos, sin)` gives the (q, k) of each softmax
map and the weight lambda of a second map, `combine_maps` the map reported (softmax rows; Diff and Diff V2: the
differential (A1 - lambda A2) / (1 - lambda), divided so that every row sums to 1 as a softmax row does, our
choice: the paper does not say how it normalises), `output_from_maps` the module's output from the maps.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch

Scores = Callable[[torch.Tensor], torch.Tensor]  # a transform of masked-out-free logits (B, H, T, T), e.g. quantise


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q k^T / sqrt d: (B, H, T, T) in fp32 (the causal upper triangle is left as computed)."""
    return q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5


def causal_mask(T: int, device=None) -> torch.Tensor:
    """True where a query may look (key index <= query index)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def softmax_map(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    return scores.masked_fill(~causal_mask(T, scores.device), float("-inf")).softmax(-1)


def softmax_maps(attn, x, cos, sin, transform: Optional[Scores] = None) -> tuple[list, Optional[torch.Tensor]]:
    """The module's softmax maps (B, H, T, T) in fp32, `transform` applied to their logits, and its lambda."""
    pairs, lam = attn.map_parts(x, cos, sin)
    return [softmax_map(transform(logits(q, k)) if transform else logits(q, k)) for q, k in pairs], lam


def attention_map(attn, x, cos, sin, transform: Optional[Scores] = None) -> torch.Tensor:
    """The (normalised) attention map (B, heads, T, T) in fp32: softmax, or (A1 - lambda A2) / (1 - lambda)."""
    return attn.combine_maps(*softmax_maps(attn, x, cos, sin, transform))


def recomputed_output(attn, x, cos, sin, transform: Optional[Scores]) -> torch.Tensor:
    """The module's output (B, T, E) recomputed in eager fp32 from its maps, `transform` applied to their logits."""
    return attn.output_from_maps(x, *softmax_maps(attn, x, cos, sin, transform))


def attention_modules(model) -> list:
    return [layer.attn for layer in model.layers]


@contextmanager
def capture(model) -> Iterator[dict]:
    """{"inputs": [(x, cos, sin) per layer], "hidden": [block output per layer]} of the next forward."""
    got: dict = {"inputs": [], "hidden": []}
    hooks = [a.register_forward_pre_hook(lambda m, args: got["inputs"].append(args[:3])) for a in attention_modules(model)]
    hooks += [layer.register_forward_hook(lambda m, args, out: got["hidden"].append(out)) for layer in model.layers]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


@contextmanager
def scores_transformed(model, transform: Optional[Scores]) -> Iterator[None]:
    """Within the block, every attention module's output is recomputed in eager fp32 from its own input with
    `transform` applied to its logits (e.g. quantisation); transform=None reproduces the module's output."""
    hooks = [a.register_forward_hook(lambda m, args, out: recomputed_output(m, *args[:3], transform))
             for a in attention_modules(model)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
