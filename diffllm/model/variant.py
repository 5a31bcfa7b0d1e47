"""The attention-variant base class and the registry that maps `ModelConfig.arch` to it.

Each variant is one module in diffllm/model/ named `*attention.py` whose class subclasses `AttentionVariant` and is
decorated with `@register`. Besides its forward it carries everything the rest of diffllm needs to know about it:
its label and plot colour, how its heads are counted, its parameter and FLOP accounting, and which kernel the planner
runs on the meta device to measure its activations. Nothing outside `diffllm/model/` compares `arch` strings.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from torch import nn

if TYPE_CHECKING:
    from .config import ModelConfig


@dataclass(frozen=True)
class Heads:
    """How a variant lays out its heads for a config whose Transformer would have `n_heads` heads of d."""

    query: int  # query heads (Diff V1: diff heads, each of two d-wide sub-heads; V2: the 2h heads of its one call)
    kv: int  # key/value heads (the KV cache holds `kv` keys of kv_dim and values of value_dim per token and layer)
    out: int  # heads concatenated before the output projection
    value_dim: int  # width of each value head

    def label(self) -> str:
        """`8 (8)`: output heads (kv heads), plus the query count when it differs, e.g. `8 (8), 16 q`."""
        return f"{self.out} ({self.kv})" + (f", {self.query} q" if self.query != self.out else "")


class AttentionVariant(nn.Module):
    """Base of every attention module: `Variant(cfg, depth, backend=None)`, forward (x, cos, sin, cache=None) ->
    (B, T, E); with a `LayerCache` the variant stores its keys/values there and attends over all cached positions.
    `backend` overrides cfg.attn_backend (the planner passes "meta")."""

    arch: ClassVar[str]  # the `model.arch` value
    label: ClassVar[str]  # for tables and plot legends
    color: ClassVar[str]  # matplotlib colour for plots
    baseline: ClassVar[bool] = False  # the variant scaling fits compare the others against

    def __init__(self, cfg: "ModelConfig", depth: int, backend: Optional[str] = None):
        super().__init__()
        self.backend = backend or cfg.attn_backend

    @classmethod
    def check(cls, cfg: "ModelConfig") -> None:
        """Raise ValueError('model.<key>: why') for a config this variant cannot build."""

    @classmethod
    def heads(cls, cfg: "ModelConfig") -> Heads:
        raise NotImplementedError

    @classmethod
    def attention_params(cls, cfg: "ModelConfig") -> int:
        """Parameters of one layer's attention, by hand from the equations (tests check it against the module)."""
        raise NotImplementedError

    @classmethod
    def attention_flops_per_token(cls, cfg: "ModelConfig", seq_len: int) -> float:
        """Training (fwd + bwd = 3 x fwd) FLOPs per token of the score and value matmuls over all layers, PaLM
        convention (no causal halving), for the kernel cfg.attn_backend runs. Projections are in 6 x matmul params."""
        raise NotImplementedError

    @classmethod
    def meta_backend(cls, cfg: "ModelConfig") -> str:
        """The backend the planner builds the block with on the meta device: "meta" (the flash-style stand-in that
        saves what a fused kernel saves: q, k, v, out and the fp32 log-sum-exp) unless the config runs eager."""
        return "eager" if cfg.attn_backend == "eager" else "meta"


_REGISTRY: dict[str, type[AttentionVariant]] = {}
_LOADED = False


def register(cls: type[AttentionVariant]) -> type[AttentionVariant]:
    """Class decorator: make `cls` the variant for `model.arch = cls.arch`."""
    if cls.arch in _REGISTRY and _REGISTRY[cls.arch] is not cls:
        raise ValueError(f"arch {cls.arch!r} registered twice ({_REGISTRY[cls.arch].__name__}, {cls.__name__})")
    _REGISTRY[cls.arch] = cls
    return cls


def variants() -> dict[str, type[AttentionVariant]]:
    """Every registered variant by arch name: the baseline first, then by name."""
    global _LOADED
    if not _LOADED:  # import every diffllm/model/*attention.py once; their @register fills the table
        from . import __path__ as here

        for mod in sorted(m.name for m in pkgutil.iter_modules(here) if m.name.endswith("attention")):
            importlib.import_module(f"{__package__}.{mod}")
        _LOADED = True
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (not kv[1].baseline, kv[0])))


def variant(arch: str) -> type[AttentionVariant]:
    """The class for `arch`; an unknown name is a one-line ValueError with the nearest valid name."""
    table = variants()
    if arch not in table:
        near = difflib.get_close_matches(str(arch), table, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"model.arch: got {arch!r}, expected one of {tuple(table)}{hint}")
    return table[arch]


def baseline() -> type[AttentionVariant]:
    return next(v for v in variants().values() if v.baseline)
