"""`AttentionVariant`: what diffllm adds to a variant's equations (diffllm/model/layers.py `AttentionEquations`) to
train and study it: the forward over the kernels (KV cache, document masks, backends), its label and plot colour, how
its heads are counted, its parameter and FLOP accounting, its init, its weight-decay exemptions, the values it
reports per layer, and the config.json keys of its `format=remote` export.

A variant is one module (diffllm/model/*attention.py, or a user's named in $DIFFLLM_VARIANTS:
diffllm/model/registry.py):

    class MyEquations(AttentionEquations):          # torch only: the export ships this class's source
        def __init__(self, cfg, depth): ...         # its projections and parameters
        def project(self, x, cos, sin): ...         # -> q, k, v
        def mix(self, x, o): ...                    # the output heads from the query heads (default: as they are)
        def finish(self, x, y): ...                 # -> (B, T, E)

    @register
    class MyAttention(AttentionVariant, MyEquations):
        arch, label, color = "mine", "Mine", "tab:olive"

The forward, the maps eval rebuilds (diffllm/eval/maps.py) and the exported model all run those three methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch
from torch import nn

from .cache import LayerCache
from .documents import Documents
from .kernels import causal_attention, causal_probs, weigh
from .layers import AttentionEquations
from .parametrization import query_scale

if TYPE_CHECKING:
    from .config import ModelConfig


@dataclass(frozen=True)
class Heads:
    """How a variant lays out its heads for a config whose Transformer would have `n_heads` heads of d."""

    query: int  # query heads (Diff V1: diff heads, each of two d-wide sub-heads; V2: the 2h heads of its one call)
    kv: int  # key/value heads (the KV cache holds `kv` keys of key_dim and values of value_dim per token and layer)
    out: int  # heads concatenated before the output projection
    value_dim: int  # width of each value head
    key_dim: Optional[int] = None  # width of each kv head's keys (Diff: its two d-wide sub-heads, 2d); None: value_dim

    def label(self) -> str:
        """`8 (8)`: output heads (kv heads), plus the query count when it differs, e.g. `8 (8), 16 q`."""
        return f"{self.out} ({self.kv})" + (f", {self.query} q" if self.query != self.out else "")


class AttentionVariant:
    """Put first among the bases of a registered variant, its equations class second: `Variant(cfg, depth,
    backend=None)`, forward (x, cos, sin, cache=None, docs=None) -> (B, T, E). With a `LayerCache` the keys and values
    are stored there and the queries attend over all cached positions; with `docs` (a `Documents`: packed rows) each
    query attends only within its own document. cos, sin: (T, r/2), or (B, T, r/2) per row. `backend` overrides
    cfg.attn_backend (the planner passes "meta")."""

    arch: ClassVar[str]  # the `model.arch` value
    label: ClassVar[str]  # for tables and plot legends
    color: ClassVar[str]  # matplotlib colour for plots
    baseline: ClassVar[bool] = False  # the variant scaling fits compare the others against
    map_normalisation: ClassVar[str] = "softmax rows"  # what eval attention says its rebuilt map rows are
    no_decay: ClassVar[tuple[str, ...]] = ()  # its parameters (local names) kept from weight decay whatever their shape
    # How parametrization=mup treats each of its parameters: fnmatch pattern of a local name -> "hidden" (a width x
    # width matrix: lr and init std scale down with width) | "vector" (constant lr and init) | "readout" (width ->
    # a fixed size: its input x 1/width_mult, which the variant's forward applies); first match wins. None:
    # undeclared, refused under mup (diffllm/model/parametrization.py). `mup_table` may compute it from the config.
    mup: ClassVar[Optional[dict[str, str]]] = None

    def __init__(self, cfg: ModelConfig, depth: int, backend: Optional[str] = None):
        super().__init__(cfg, depth)  # the equations: projections and parameters, in their order
        self.backend = backend or cfg.attn_backend
        self.query_scale = self.mup_query_scale(cfg)  # 1 but under mup with base_head_dim: sqrt(base_head_dim / d)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: Optional[LayerCache] = None,
        docs: Optional[Documents] = None,
    ) -> torch.Tensor:
        q, k, v = self.scaled_project(x, cos, sin)  # (B, Hq, T, d), (B, Hk, T, d), (B, Hv, T, dv)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H*, pos + T, d*)
        return self.finish(x, self.attend(x, q, k, v, docs))  # (B, T, E)

    def scaled_project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """`project`, the queries times `query_scale` (mup's sqrt(base_head_dim)/d logits; an export folds it into
        the query projection)."""
        q, k, v = self.project(x, cos, sin)
        return (q if self.query_scale == 1.0 else q * self.query_scale), k, v

    def attend(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Optional[Documents]
    ) -> torch.Tensor:
        """The mixed heads (B, H, T, dv). eager: the materialised maps mixed first, so the values are multiplied once
        ((A1 - lambda A2) V); other backends: the kernel over the Hq query heads (kernels.causal_attention: one call
        on the CPU, calls of one head dim on a GPU), then mixed."""
        if self.backend == "eager":
            return weigh(self.mix(x, causal_probs(q, k, docs)), v)
        return self.mix(x, causal_attention(q, k, v, self.backend, docs))  # v untiled: key head i reads i % Hv

    def scores(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q k^T / sqrt d of every query head (B, Hq, T, T) in fp32, the values (B, Hv, T, dv) in fp32) from this
        module's input x (B, T, E): query head j reads key head j // (Hq/Hk), as in the kernel call. Eval's maps and
        training's logit telemetry read them (diffllm/eval/maps.py)."""
        q, k, v = self.scaled_project(x, cos, sin)
        q, k = q.float(), k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, Hq, T, d)
        return q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, v.float()

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise UserError('model.<key>: why') for a config this variant cannot build."""

    @classmethod
    def mup_table(cls, cfg: ModelConfig) -> Optional[dict[str, str]]:
        """Its mup declaration for `cfg`: the class attribute `mup` (MLA computes its own from which widths grow)."""
        return cls.mup

    @classmethod
    def mup_folds(cls, cfg: ModelConfig) -> dict[str, float]:
        """Under mup, the multipliers its forward applies beside the kinds' (local parameter name -> factor an export
        folds into that parameter): MLA's readouts' inputs, Diff's scaled lambda dot products; none by default."""
        return {}

    @classmethod
    def mup_query_scale(cls, cfg: ModelConfig) -> float:
        """What the queries are multiplied by: 1, but under mup with base_head_dim sqrt(base_head_dim / d), so the
        kernels' 1/sqrt(d) becomes mup's sqrt(base_head_dim)/d."""
        return query_scale(cfg)

    @classmethod
    def query_weights(cls, cfg: ModelConfig) -> tuple[str, ...]:
        """The parameters (local names) whose product is the queries: an export folds the query scale into them."""
        return ("q_proj.weight", "q_proj.bias")

    @classmethod
    def heads(cls, cfg: ModelConfig) -> Heads:
        raise NotImplementedError

    @classmethod
    def rotary_dim(cls, cfg: ModelConfig) -> int:
        """The width the model's cos/sin cover (`rotary_cos_sin(T, rotary_dim, ...)`, handed to `project`): rotary_pct
        of the head dim d by default (MLA: its decoupled RoPE width)."""
        return int(cfg.head_dim * cfg.rotary_pct)

    @classmethod
    def kv_cache_width(cls, cfg: ModelConfig) -> int:
        """Numbers the KV cache holds per token and layer: what `project` hands the cache (k and v, or whatever the
        variant caches instead). Default, from its heads: kv x (key_dim + value_dim). `diffllm info` and the planner
        turn it into bytes (accounting.kv_cache_bytes_per_token); tests/model/test_kv_bytes.py checks it against a
        real cache."""
        h = cls.heads(cfg)
        return h.kv * ((h.key_dim or h.value_dim) + h.value_dim)

    @classmethod
    def attention_params(cls, cfg: ModelConfig) -> int:
        """Parameters of one layer's attention, by hand from the equations (tests check it against the module)."""
        raise NotImplementedError

    @classmethod
    def attention_flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Training (fwd + bwd = 3 x fwd) FLOPs per token of the score and value matmuls over all layers, PaLM
        convention (no causal halving), for the kernel cfg.attn_backend runs. Projections are in 6 x matmul params."""
        raise NotImplementedError

    @classmethod
    def meta_backend(cls, cfg: ModelConfig) -> str:
        """The backend the planner builds the block with on the meta device: "meta" (the flash-style stand-in that
        saves what a fused kernel saves: q, k, v, out and the fp32 log-sum-exp) unless the config runs eager."""
        return "eager" if cfg.attn_backend == "eager" else "meta"

    @torch.no_grad()
    def init_parameter(self, name: str, p: nn.Parameter, cfg: ModelConfig) -> None:
        """Initialise this module's parameter `name` (its name within the module). DecoderLM.reset_parameters calls
        it for each of the module's parameters in `named_parameters` order, between the model's other parameters,
        so the random draws come in the model's parameter order. Default, the model's own rule: N(0, init_std) for
        matrices, zero biases, ones for other vectors (norm weights)."""
        init_parameter(name, p, cfg.init_std)

    # ----- telemetry: eval attention and training diagnostics ------------------------------------------------------
    def report(self) -> dict[str, float]:
        """Per-layer values read from the parameters (Diff: {"lambda": ...}): eval attention reports them beside the
        maps, training logs `<key>/<layer>` and `<key>_min`. {} for none."""
        return {}

    def warning(self, key: str, value: float) -> Optional[str]:
        """What is wrong when a reported value is `value` (training says it once per layer), or None."""
        return None

    def probes(self) -> dict[str, tuple[nn.Module, object]]:
        """Forward-side values training logs as `<key>/<layer>` (the mean over the step's forwards): key ->
        (a submodule, fn(its output) -> 0-dim tensor). Diff V2: the mean gate sigmoid(x W_lambda)."""
        return {}

    # ----- format=remote export (diffllm/export/remote) ---------------------------------------------------------
    @classmethod
    def remote_config(cls, cfg: ModelConfig) -> dict:
        """The ModelConfig keys besides the shared ones that its equations read, for the export's config.json (Diff:
        lambda_init); `diffllm import` reads every ModelConfig key it finds there."""
        return {}

    @classmethod
    def equations(cls) -> list[type]:
        """Its equations classes, base first (AttentionEquations excluded): the source a remote export ships."""
        return [
            c
            for c in reversed(cls.__mro__)
            if issubclass(c, AttentionEquations) and not issubclass(c, AttentionVariant) and c is not AttentionEquations
        ]


def init_parameter(name: str, p: torch.Tensor, std: float) -> None:
    """N(0, std) for every matrix and embedding, zero biases, ones for other vectors (norm weights)."""
    if p.dim() >= 2:
        p.normal_(0.0, std)
    elif name.endswith("bias"):
        p.zero_()
    else:
        p.fill_(1.0)
