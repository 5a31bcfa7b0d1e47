"""Differential attention against an independent float64 implementation of the paper's equations; lambda details."""

import contextlib
import math

import pytest
import torch

from diffllm.model import ModelConfig
from diffllm.model.diff_attention import DiffAttention
from diffllm.model.kernels import flash_form_on_cpu
from diffllm.model.layers import rotary_cos_sin

from .reference import diff_attention_reference


def _module(n_heads, n_kv_heads, depth, rotary_pct=1.0, interleaved=True, backend="sdpa", lambda_init=None):
    cfg = ModelConfig(
        arch="diff",
        d_model=64,
        n_layers=8,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        rotary_pct=rotary_pct,
        rope_interleaved=interleaved,
        attn_backend=backend,
        lambda_init=lambda_init,
        rope_theta=500.0,
    )
    torch.manual_seed(depth * 10 + n_heads + (n_kv_heads or 0))
    m = DiffAttention(cfg, depth).double()
    with torch.no_grad():
        for p in m.parameters():  # random everything, including the shared subln weight and lambda vectors
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.2))
    return cfg, m


@pytest.mark.parametrize("backend", ["eager", "sdpa", "sdpa-gpu-form"])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, None), (8, 4), (8, 2)])  # MHA; GQA n_rep=2; GQA n_rep=4
@pytest.mark.parametrize("depth", [0, 1, 5])
@pytest.mark.parametrize("interleaved,rotary_pct", [(True, 1.0), (False, 0.5)])
def test_matches_float64_reference(backend, n_heads, n_kv_heads, depth, interleaved, rotary_pct):
    """sdpa-gpu-form: a GPU's four calls of head dim d (kernels.flash_form_on_cpu), as multihead_flashdiff_2."""
    cfg, m = _module(n_heads, n_kv_heads, depth, rotary_pct, interleaved, backend.removesuffix("-gpu-form"))
    B, T = 2, 12
    x = torch.randn(B, T, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(T, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    with flash_form_on_cpu() if backend.endswith("-gpu-form") else contextlib.nullcontext():
        got = m(x, cos, sin)
    W = {
        "q": m.q_proj.weight,
        "k": m.k_proj.weight,
        "v": m.v_proj.weight,
        "out": m.out_proj.weight,
        "subln": m.subln.weight,
    }
    W = {k: v.detach() for k, v in W.items()}
    lam = [p.detach() for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2)]
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    for b in range(B):
        want = diff_attention_reference(
            x[b],
            W,
            lam,
            lambda_init,
            h=n_heads // 2,
            h_kv=(n_kv_heads or n_heads) // 2,
            d=cfg.head_dim,
            rotary_dim=cfg.rotary_dim,
            theta=cfg.rope_theta,
            interleaved=interleaved,
        )
        torch.testing.assert_close(got[b].detach(), want, atol=1e-10, rtol=1e-9)


def test_gqa_pairing_is_the_flash_files_not_the_naive_file():
    """With n_rep=2 the naive official file would give both maps of head i the same key head; ours (flash files) uses
    key sub-heads 2g and 2g+1. Swapping the two key sub-heads of one group must change the output."""
    cfg, m = _module(8, 4, depth=2)
    x = torch.randn(1, 10, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(10, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    before = m(x, cos, sin)
    d = cfg.head_dim
    with torch.no_grad():
        w = m.k_proj.weight
        w[: 2 * d] = torch.cat([w[d : 2 * d], w[:d]])  # swap K1 and K2 of group 0
    after = m(x, cos, sin)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize("depth,expected", [(0, 0.2), (1, 0.8 - 0.6 * math.exp(-0.3)), (5, 0.8 - 0.6 * math.exp(-1.5))])
def test_lambda_init_follows_the_zero_based_formula(depth, expected):
    cfg = ModelConfig(arch="diff", d_model=64, n_heads=4, n_layers=8)
    assert DiffAttention(cfg, depth).lambda_init == pytest.approx(expected, abs=1e-15)
    assert DiffAttention(ModelConfig(arch="diff", d_model=64, n_heads=4, lambda_init=0.8), depth).lambda_init == 0.8


def test_lambda_parameters_get_gradients_and_lambda_is_fp32():
    cfg, m = _module(4, None, depth=3)
    m = m.float()
    x = torch.randn(2, 8, cfg.d_model)
    cos, sin = rotary_cos_sin(8, cfg.rotary_dim, cfg.rope_theta, x.device)
    m(x, cos, sin).square().mean().backward()
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln.weight"):
        grad = m.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert m.bfloat16().lambda_full().dtype == torch.float32


def test_parameter_count_matches_official_example():
    """The official example.py: E=1024 MHA (8 diff heads) -> 4,194,688 attention params; GQA (4 kv) -> 3,146,112."""
    mha = DiffAttention(ModelConfig(arch="diff", d_model=1024, n_heads=16), depth=0)
    gqa = DiffAttention(ModelConfig(arch="diff", d_model=1024, n_heads=16, n_kv_heads=8), depth=0)
    assert sum(p.numel() for p in mha.parameters()) == 4_194_688
    assert sum(p.numel() for p in gqa.parameters()) == 3_146_112
    assert {n for n, _ in mha.named_parameters()} == {
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "out_proj.weight",
        "lambda_q1",
        "lambda_k1",
        "lambda_q2",
        "lambda_k2",
        "subln.weight",
    }
