"""ModelConfig: the one typed config that builds every decoder-only LM; `arch` names a registered attention variant
(diffllm/model/registry.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..errors import UserError
from .registry import variant

NORMS = ("rmsnorm", "layernorm")
BACKENDS = ("eager", "sdpa", "flash", "triton")
PARAMETRIZATIONS = ("sp", "mup", "completep")  # diffllm/model/parametrization.py


@dataclass
class ModelConfig:
    """Layout of a decoder-only LM. `n_heads`/`n_kv_heads` are always the *Transformer's* head counts; the Diff model
    uses n_heads/2 heads (and n_kv_heads/2 kv heads) of twice the value width, with the same head dim d; Diff V2 uses
    2 n_heads query heads of d, n_kv_heads kv heads and n_heads output heads."""

    name: str = field(default="custom", metadata={"resume": ("label",)})  # what was loaded calls it
    arch: str = "transformer"  # a registered variant: transformer | diff | diff2 | one from $DIFFLLM_VARIANTS
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # decoder blocks
    n_heads: int = 4  # the Transformer's attention heads (Diff: n_heads/2 heads of twice the value width)
    n_kv_heads: Optional[int] = None  # None -> n_heads (MHA)
    ffn_dim: Optional[int] = None  # None -> int(8/3 * d_model), the paper's SwiGLU width
    vocab_size: int = 8192  # raw tokenizer vocabulary; the embedding is padded up to `vocab_multiple`
    vocab_multiple: int = 64  # the embedding rows are vocab_size rounded up to a multiple of this
    norm: str = "rmsnorm"  # rmsnorm (paper) | layernorm with bias (StableLM)
    norm_eps: float = 1e-5  # epsilon of every RMSNorm/LayerNorm
    rotary_pct: float = 1.0  # fraction of each head dim that is rotated (StableLM: 0.25)
    rope_theta: float = 10000.0  # RoPE base
    rope_interleaved: bool = False  # GPT-J pairs (2i, 2i+1) as the official Diff code; False = NeoX rotate-half (HF)
    qkv_bias: bool = False  # biases on the q, k, v projections (StableLM: false)
    tie_embeddings: bool = False  # the output head shares the input embedding matrix
    init_std: float = 0.02  # std of the normal init of every weight matrix
    # sp (standard) | mup (Tensor Programs V for AdamW: hidden matrices' lr and init std, and the logits, scale with
    # base_width / d_model; docs/model.md, diffllm/model/parametrization.py) | completep (mup + depth: residual
    # branches and in-block AdamW eps x base_depth / n_layers, CompleteP with alpha 1)
    parametrization: str = "sp"
    base_width: Optional[int] = None  # mup: d_model of the base model (heads and ffn scale with it); null: d_model
    base_head_dim: Optional[int] = None  # mup: attention logits q.k sqrt(base_head_dim)/d; null: 1/sqrt(d) as sp
    # completep (mup + CompleteP's depth rules): n_layers of the base model; residual branches x base_depth/n_layers
    base_depth: Optional[int] = None
    # the longest sequence the model is built for (RoPE tables, the KV cache); data.seq_len may not exceed it
    max_seq_len: int = field(default=2048, metadata={"resume": ("kept",)})
    # eager (materialised maps, the reference) | sdpa | flash | triton (fused Diff kernel)
    attn_backend: str = field(default="sdpa", metadata={"resume": ("operational", "kept")})
    # Variant options: read (and checked) only by the variant that documents them, ignored by the others.
    lambda_init: Optional[float] = None  # diff: None -> 0.8 - 0.6 exp(-0.3 depth); a float = constant (ablation)
    lambda_std: float = 0.1  # diff: init std of lambda_{q,k}{1,2}
    # diff under mup with base_head_dim: the lambda dot products x base_head_dim / d (mup's 1/d); false: plain
    lambda_mup_scale: bool = False
    # mla (DeepSeek-V2 latent attention, mla_attention.py); None -> DeepSeek-V2's ratios to d = d_model / n_heads
    q_lora_rank: Optional[int] = None  # mla: width of the query latent c_Q; None -> a full-rank W_Q
    kv_lora_rank: Optional[int] = None  # mla: width of the cached latent c_KV; None -> 4 d
    qk_nope_head_dim: Optional[int] = None  # mla: per-head query/key width without RoPE; None -> d
    qk_rope_head_dim: Optional[int] = None  # mla: decoupled RoPE width (one key for all heads); None -> d/2, even
    v_head_dim: Optional[int] = None  # mla: per-head value width; None -> d
    # an HF model folder or a diffllm run to start from: its architecture, weights and tokenizer, a fresh optimizer at
    # step 0
    init_from: Optional[str] = field(default=None, metadata={"resume": ("kept",)})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(key: str, why: str) -> None:
            raise UserError(f"model.{key}: {why}")

        arch = variant(self.arch)  # unknown -> "model.arch: got 'x', expected one of (...)"
        if self.norm not in NORMS:
            bad("norm", f"got {self.norm!r}, expected one of {NORMS}")
        if self.attn_backend not in BACKENDS:
            bad("attn_backend", f"got {self.attn_backend!r}, expected one of {BACKENDS}")
        if self.d_model % self.n_heads:
            bad("n_heads", f"{self.n_heads} does not divide d_model={self.d_model}")
        if self.n_heads % self.kv_heads:
            bad("n_kv_heads", f"{self.kv_heads} does not divide n_heads={self.n_heads}")
        arch.check(self)
        self.check_parametrization()
        if not 0.0 < self.rotary_pct <= 1.0 or self.rotary_dim % 2:
            bad("rotary_pct", f"{self.rotary_pct} gives an odd or empty rotary dim ({self.rotary_dim})")
        if self.vocab_size < 1:
            bad("vocab_size", f"must be positive, got {self.vocab_size}")

    def check_parametrization(self) -> None:
        """Raise UserError for a config μP cannot build (ModelConfig.validate calls it)."""
        if self.parametrization not in PARAMETRIZATIONS:
            raise UserError(f"model.parametrization: got {self.parametrization!r}, expected one of {PARAMETRIZATIONS}")
        for key in ("base_width", "base_head_dim", "base_depth"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(f"model.{key}: must be a positive integer or null, got {value!r}")
        if self.parametrization == "sp":
            return
        if self.variant.mup_table(self) is None:
            raise UserError(
                f"model.parametrization: {self.parametrization} needs arch {self.arch!r} to declare how each of its "
                f"parameters is treated (its class attribute `mup`, see diffllm/model/parametrization.py); it declares "
                f"nothing"
            )

    @property
    def variant(self):
        """The attention class registered for `arch` (diffllm/model/registry.py)."""
        return variant(self.arch)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        """d: the Transformer's head dim, which is also each Diff sub-head's dim."""
        return self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """The width RoPE rotates, as the variant declares it (default: rotary_pct of d; MLA: qk_rope_head_dim)."""
        return self.variant.rotary_dim(self)

    @property
    def ffn_hidden(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else int(8 * self.d_model / 3)

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple
