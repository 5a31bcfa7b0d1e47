"""Which kernel a GPU runs, read on the CPU: every attention call of a forward+backward of the paper-size presets
(830M-13.1B, 3B, every arch) recorded on the meta device, with and without document masks.

`F.scaled_dot_product_attention` and flex attention are replaced by recorders that check nothing but record each
call's arguments and return an empty output of the right shape (autograd-compatible, so the backward runs); the
assertions are PyTorch's own conditions for SDPA's flash kernel (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
`can_use_flash_attention`): q, k and v of one head dim <= 256, last dim contiguous, no attn_mask, is_causal with
as many queries as keys, GQA only as whole groups; with documents, flex attention with the documents' BlockMask and
no dense mask. The FLOPs of the recorded calls (2 Tq Tk d_qk + 2 Tq Tk d_v per head per call, x3 for fwd+bwd, no
causal halving) are what the planner counts (`attention_flops_per_token`), and the planner's "meta" kernel sees the
same calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from diffllm.model import DecoderLM, kernels
from diffllm.model.accounting import attention_flops_per_token
from diffllm.model.decoder import Block
from diffllm.model.layers import rotary_cos_sin
from diffllm.model.presets import load_preset, preset_names
from tests.saved_bytes import saved_storage_bytes

PAPER = sorted(n for n in preset_names() if re.fullmatch(r"(\w+)-(830m|1\.4b|2\.8b|3b|6\.8b|13\.1b)(-gqa)?", n))
FAST = ("transformer-830m-gqa", "diff-830m-gqa", "diff2-830m-gqa", "mla-830m")  # GQA; MLA's 144/96 head dims
PRESETS = [p if p in FAST else pytest.param(p, marks=pytest.mark.slow) for p in PAPER]  # the rest: the slow suite
META = torch.device("meta")


@dataclass(frozen=True)
class Call:
    kernel: str  # "sdpa" | "flex"
    q: tuple
    k: tuple
    v: tuple
    strides_last: tuple  # q, k, v stride(-1)
    attn_mask: bool  # a dense mask was passed
    is_causal: bool
    enable_gqa: bool
    block_mask: bool  # flex: a BlockMask was passed
    dtype: torch.dtype

    def flops(self) -> float:
        """Forward FLOPs: per query head 2 Tq Tk d_qk (scores) + 2 Tq Tk d_v (values); the batch is 1."""
        _, H, Tq, d = self.q
        return H * (2 * Tq * self.k[2] * d + 2 * Tq * self.k[2] * self.v[3])


class _Empty(torch.autograd.Function):
    """An output of shape (B, Hq, Tq, dv) whose backward hands q, k and v gradients of their shapes."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.shapes = q, k, v
        return q.new_empty(*q.shape[:3], v.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.empty_like(t) for t in ctx.shapes)


def _record(calls: list[Call], kernel: str):
    def run(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, block_mask=None):
        assert dropout_p == 0.0 and scale is None
        strides = (q.stride(-1), k.stride(-1), v.stride(-1))
        calls.append(
            Call(kernel, *(tuple(t.shape) for t in (q, k, v)), strides, attn_mask is not None, is_causal, enable_gqa,
                 block_mask is not None, q.dtype)
        )  # fmt: skip
        return _Empty.apply(q, k, v)

    return run


_RECORDED: dict[tuple[str, bool], list[Call]] = {}


def recorded(preset: str, documents: bool) -> list[Call]:
    """Every attention call of one forward+backward (loss from the model's head) of `preset` in bf16 on the meta
    device at its max_seq_len, with three documents per row when `documents`. Memoised: the tests share them."""
    if (preset, documents) not in _RECORDED:
        cfg = load_preset(preset)
        calls: list[Call] = []
        with pytest.MonkeyPatch.context() as mp, torch.device(META):
            mp.setattr(F, "scaled_dot_product_attention", _record(calls, "sdpa"))
            mp.setattr(kernels, "flex_attention", _record(calls, "flex"))
            model = DecoderLM(cfg).to(torch.bfloat16)
            T = cfg.max_seq_len
            tokens = torch.zeros(1, T, dtype=torch.long)
            ids = (torch.arange(T) * 3 // T)[None] if documents else None  # on meta: shapes only
            model(tokens, doc_ids=ids, restart_positions=documents, targets=tokens).backward()
        _RECORDED[preset, documents] = calls
    return _RECORDED[preset, documents]


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "doc_mask"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_attention_call_of_the_paper_presets_is_flash_eligible(preset, documents):
    cfg = load_preset(preset)
    calls = recorded(preset, documents)
    per_layer = {"diff": 4}.get(cfg.arch, 1)  # Diff: each component over each d-wide half of V
    assert len(calls) == cfg.n_layers * per_layer, calls[:2]
    for c in calls:
        d = c.q[3]
        assert c.k[3] == c.v[3] == d <= 256, c  # one head dim for q, k, v
        assert c.strides_last == (1, 1, 1) and c.dtype == torch.bfloat16, c
        assert c.q[0] == c.k[0] == c.v[0] and c.q[2] == c.k[2] == c.v[2], c  # as many queries as keys
        assert c.k[1] == c.v[1] and c.q[1] % c.k[1] == 0 and c.enable_gqa == (c.q[1] != c.k[1]), c  # whole groups
        assert not c.attn_mask, c  # no dense mask, on either path
        if documents:
            assert c.kernel == "flex" and c.block_mask and not c.is_causal, c
        else:
            assert c.kernel == "sdpa" and c.is_causal, c


@pytest.mark.parametrize("preset", PRESETS)
def test_the_planner_counts_the_flops_of_the_recorded_calls(preset):
    """attention_flops_per_token (what MFU and the planner divide by) = the recorded calls' FLOPs x 3 / tokens."""
    cfg = load_preset(preset)
    T = cfg.max_seq_len
    for documents in (False, True):
        counted = 3 * sum(c.flops() for c in recorded(preset, documents)) / T
        assert counted == attention_flops_per_token(cfg, T), (preset, documents)


@pytest.mark.parametrize("preset", FAST)
def test_the_planners_meta_kernel_makes_the_recorded_calls(preset, monkeypatch):
    """The block the planner measures activations with (diffllm/scaling/activations.py: backend "meta") calls its
    stand-in with the shapes SDPA gets on a GPU, so it saves what those calls save."""
    cfg = load_preset(preset)
    want = [(c.q, c.k, c.v) for c in recorded(preset, False)[: {"diff": 4}.get(cfg.arch, 1)]]
    seen = []
    apply = kernels._MetaFlash.apply
    monkeypatch.setattr(
        kernels._MetaFlash, "apply", lambda q, k, v: seen.append((q.shape, k.shape, v.shape)) or apply(q, k, v)
    )
    T = cfg.max_seq_len
    with torch.device(META):
        block = Block(cfg, depth=0, backend=cfg.variant.meta_backend(cfg)).to(torch.bfloat16)
        block(torch.empty(1, T, cfg.d_model, dtype=torch.bfloat16), *rotary_cos_sin(T, cfg.rotary_dim, cfg.rope_theta))
    assert [tuple(map(tuple, s)) for s in seen] == want


def _saved_bytes_per_token(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> float:
    """Bytes autograd saves in one block's forward, by storage (parameters excluded), per token."""
    saved, _ = saved_storage_bytes(lambda: block(x, cos, sin).sum().backward(), block.parameters())
    return saved / x.shape[1]


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2", "mla"])
def test_the_planners_meta_kernel_saves_what_the_gpu_form_saves(arch):
    """The planner's activation bytes (meta device, the "meta" kernel) equal what a real block saves in the GPU form,
    run on the CPU (kernels.flash_form_on_cpu: there SDPA's CPU flash kernel takes the one-head-dim calls and keeps
    q, k, v, out and the log-sum-exp, as FlashAttention-2 does), fp32."""
    from diffllm.scaling.activations import activation_bytes

    cfg = load_preset(f"{arch}-tiny")
    T = 256
    torch.manual_seed(0)
    block = Block(cfg, cfg.n_layers - 1)
    x = torch.randn(1, T, cfg.d_model, requires_grad=True)
    with kernels.flash_form_on_cpu():
        real = _saved_bytes_per_token(block, x, *rotary_cos_sin(T, cfg.rotary_dim, cfg.rope_theta))
    assert activation_bytes(cfg, T, dtype=torch.float32).block == real
