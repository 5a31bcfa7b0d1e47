"""The attention-variant base class and the registry that maps `ModelConfig.arch` to it.

Each variant is one module whose class subclasses `AttentionVariant` and is decorated with `@register`: the built-in
ones are diffllm/model/*attention.py; a user's are the modules named in the environment variable
`DIFFLLM_VARIANTS=pkg.mod,other_mod` (importable, e.g. on PYTHONPATH), imported by `variants()` in every process that
looks a variant up (a launcher's children inherit the variable). Besides its forward a variant carries everything
the rest of diffllm needs to know about it: its label and plot colour, how its heads are counted, its parameter and
FLOP accounting, which kernel the planner measures its activations with, its parameter init, how its attention maps
are rebuilt (eval attention, outliers), what it reports per layer, and its remote-code attention class for
`diffllm export format=remote` (diffllm/model/remote.py). Nothing outside `diffllm/model/` compares `arch` strings.
"""
from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch
from torch import nn
from ..errors import UserError

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
    """Base of every attention module: `Variant(cfg, depth, backend=None)`, forward (x, cos, sin, cache=None,
    docs=None) -> (B, T, E); with a `LayerCache` the variant stores its keys/values there and attends over all cached
    positions; with `docs` (a `Documents`: packed rows, passed only when set) each query attends only within its own
    document (hand docs to `causal_attention` / `causal_probs`). cos, sin: (T, r/2), or (B, T, r/2) per row.
    `backend` overrides cfg.attn_backend (the planner passes "meta")."""

    arch: ClassVar[str]  # the `model.arch` value
    label: ClassVar[str]  # for tables and plot legends
    color: ClassVar[str]  # matplotlib colour for plots
    baseline: ClassVar[bool] = False  # the variant scaling fits compare the others against

    map_normalisation: ClassVar[str] = "softmax rows"  # what eval attention says its rebuilt map rows are
    remote: ClassVar[Optional[type]] = None  # the torch-only attention class shipped with a format=remote export

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

    # ----- init ---------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_parameter(self, name: str, p: nn.Parameter, cfg: "ModelConfig") -> None:
        """Initialise this module's parameter `name` (its name within the module). DecoderLM.reset_parameters calls
        it for each of the module's parameters in `named_parameters` order, between the model's other parameters,
        so the random draws come in the model's parameter order. Default, the model's own rule: N(0, init_std) for
        matrices, zero biases, ones for other vectors (norm weights)."""
        init_parameter(name, p, cfg.init_std)

    # ----- attention maps (diffllm/eval/maps.py) --------------------------------------------------------------------
    def map_parts(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Optional[torch.Tensor]]:
        """From this module's input x (B, T, E) and rotary (cos, sin): the (q, k) of each softmax map, each
        (B, H, T, d) in fp32 with H = heads(cfg).out (kv heads repeated to their queries), and the weight lambda of
        the second map (None for one map; a scalar, or one per head and query (B, H, T, 1))."""
        raise NotImplementedError(f"{type(self).__name__} does not rebuild its attention maps")

    def combine_maps(self, maps: list[torch.Tensor], lam: Optional[torch.Tensor]) -> torch.Tensor:
        """The map eval reports (B, H, T, T) from the softmax maps of `map_parts`: one map as it is; two as the
        differential (A1 - lambda A2) / (1 - lambda), whose rows sum to 1 as a softmax row does."""
        return maps[0] if lam is None else (maps[0] - lam * maps[1]) / (1 - lam)

    def output_from_maps(self, x: torch.Tensor, maps: list[torch.Tensor], lam: Optional[torch.Tensor]) -> torch.Tensor:
        """This module's output (B, T, E) recomputed from its input x and the softmax maps (B, H, T, T) of
        `map_parts` (eval quantises their logits first)."""
        raise NotImplementedError(f"{type(self).__name__} does not rebuild its attention maps")

    def report(self) -> dict[str, float]:
        """Per-layer values eval attention reports beside the maps (Diff: {"lambda": ...}); {} for none."""
        return {}

    # ----- format=remote export (diffllm/export/remote) ---------------------------------------------------------
    @classmethod
    def remote_config(cls, cfg: "ModelConfig") -> dict:
        """Extra config.json keys the remote attention class reads (Diff: each layer's lambda_init)."""
        return {}

    @classmethod
    def from_remote_config(cls, cfg: "ModelConfig", hf_cfg) -> None:
        """Set on cfg (built from the shared keys) what `remote_config` wrote, when importing a remote export."""


def init_parameter(name: str, p: torch.Tensor, std: float) -> None:
    """N(0, std) for every matrix and embedding, zero biases, ones for other vectors (norm weights)."""
    if p.dim() >= 2:
        p.normal_(0.0, std)
    elif name.endswith("bias"):
        p.zero_()
    else:
        p.fill_(1.0)


_REGISTRY: dict[str, type[AttentionVariant]] = {}
_LOADED = False
ENV = "DIFFLLM_VARIANTS"  # comma-separated modules that register more variants


def register(cls: type[AttentionVariant]) -> type[AttentionVariant]:
    """Class decorator: make `cls` the variant for `model.arch = cls.arch`."""
    if cls.arch in _REGISTRY and _REGISTRY[cls.arch] is not cls:
        raise UserError(f"arch {cls.arch!r} registered twice ({_REGISTRY[cls.arch].__name__}, {cls.__name__})")
    _REGISTRY[cls.arch] = cls
    return cls


def variants() -> dict[str, type[AttentionVariant]]:
    """Every registered variant by arch name: the baseline first, then by name (the built-in modules, then those
    named in $DIFFLLM_VARIANTS)."""
    global _LOADED
    if not _LOADED:  # import every diffllm/model/*attention.py once; their @register fills the table
        here = [os.path.dirname(__file__)]  # this package's folder (not the package: it imports this module)
        for mod in sorted(m.name for m in pkgutil.iter_modules(here) if m.name.endswith("attention")):
            importlib.import_module(f"{__package__}.{mod}")
        _LOADED = True
    for name in filter(None, (m.strip() for m in os.environ.get(ENV, "").split(","))):
        try:
            importlib.import_module(name)  # cached after the first time; its @register fills the table
        except ImportError as e:
            raise UserError(f"{ENV}: cannot import {name!r} ({e})") from None
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (not kv[1].baseline, kv[0])))


def variant(arch: str) -> type[AttentionVariant]:
    """The class for `arch`; an unknown name is a one-line ValueError with the nearest valid name."""
    table = variants()
    if arch not in table:
        near = difflib.get_close_matches(str(arch), table, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UserError(f"model.arch: got {arch!r}, expected one of {tuple(table)}{hint}")
    return table[arch]


def baseline() -> type[AttentionVariant]:
    return next(v for v in variants().values() if v.baseline)
