"""Attention maps and logits rebuilt in fp32 from each attention module's own equations, whatever kernel the model
runs (sdpa/flash never materialise them). Forward pre-hooks capture each attention module's input (x, cos, sin);
nothing of the model is patched.

The variant's equations (diffllm/model/layers.py `AttentionEquations`) say how, the same methods its forward runs:
`project` gives q and k (`AttentionVariant.scores`: their logits), whose softmax maps (B, Hq, T, T) are those of its
query heads; `mix`, linear, turns them into the H maps that weigh the values (Diff and Diff V2: A1 - lambda A2);
`finish` the output from the weighed values. The map reported is the mixed map divided by its row sums, so every row
sums to 1 as a softmax row does (Diff:
(A1 - lambda A2) / (1 - lambda), our choice: the paper does not say how it normalises).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch

from ..model.documents import causal_mask
from ..model.kernels import weigh

Scores = Callable[[torch.Tensor], torch.Tensor]  # a transform of masked-out-free logits (B, H, T, T), e.g. quantise


def softmax_map(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    return scores.masked_fill(~causal_mask(T, T, scores.device), float("-inf")).softmax(-1)


def mixed_maps(attn, x, cos, sin, transform: Optional[Scores] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the H mixed maps (B, H, T, T), the values): the query heads' softmax maps, `transform` applied to their
    logits first, mixed as the variant mixes its heads."""
    scores, v = attn.scores(x, cos, sin)
    return attn.mix(x, softmax_map(transform(scores) if transform else scores)), v


def attention_map(attn, x, cos, sin, transform: Optional[Scores] = None) -> torch.Tensor:
    """The normalised attention map (B, H, T, T) in fp32: softmax, or (A1 - lambda A2) / (1 - lambda)."""
    maps, _ = mixed_maps(attn, x, cos, sin, transform)
    return maps / maps.sum(-1, keepdim=True)


def recomputed_output(attn, x, cos, sin, transform: Optional[Scores]) -> torch.Tensor:
    """The module's output (B, T, E) recomputed in eager fp32 from its maps, `transform` applied to their logits."""
    maps, v = mixed_maps(attn, x, cos, sin, transform)
    return attn.finish(x, weigh(maps, v).to(x.dtype))


def attention_modules(model) -> list:
    return [layer.attn for layer in model.layers]


@contextmanager
def capture(model) -> Iterator[dict]:
    """{"inputs": [(x, cos, sin) per layer], "hidden": [block output per layer]} of the next forward."""
    got: dict = {"inputs": [], "hidden": []}
    hooks = [
        a.register_forward_pre_hook(lambda m, args: got["inputs"].append(args[:3])) for a in attention_modules(model)
    ]
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
    hooks = [
        a.register_forward_hook(lambda m, args, out: recomputed_output(m, *args[:3], transform))
        for a in attention_modules(model)
    ]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
