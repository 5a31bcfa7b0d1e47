"""Diff Transformer V2 against an independent float64 implementation of its equations (loops over heads); the
pairing rule, lambda per token and head, parameter counts by hand."""

import pytest
import torch

from diffllm.model import ModelConfig
from diffllm.model.diff2_attention import Diff2Attention
from diffllm.model.layers import rotary_cos_sin

from .reference import diff2_attention_reference


def _module(n_heads, n_kv_heads, rotary_pct=1.0, interleaved=True, backend="sdpa"):
    cfg = ModelConfig(
        arch="diff2",
        d_model=64,
        n_layers=2,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        rotary_pct=rotary_pct,
        rope_interleaved=interleaved,
        attn_backend=backend,
        rope_theta=500.0,
    )
    torch.manual_seed(n_heads + (n_kv_heads or 0))
    m = Diff2Attention(cfg, depth=1).double()
    with torch.no_grad():
        for p in m.parameters():  # lambda_proj large enough that sigmoid spans (0, 1), not a constant 0.5
            p.copy_(torch.randn_like(p) * 0.2)
    return cfg, m


def _weights(m):
    W = {
        "q": m.q_proj.weight,
        "k": m.k_proj.weight,
        "v": m.v_proj.weight,
        "out": m.out_proj.weight,
        "lam": m.lambda_proj.weight,
    }
    return {k: v.detach() for k, v in W.items()}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, None), (8, 4), (8, 2)])  # MHA; GQA n_rep=2; GQA n_rep=4
@pytest.mark.parametrize("interleaved,rotary_pct", [(True, 1.0), (False, 0.5)])
def test_matches_float64_reference(backend, n_heads, n_kv_heads, interleaved, rotary_pct):
    cfg, m = _module(n_heads, n_kv_heads, rotary_pct, interleaved, backend)
    B, T = 2, 12
    x = torch.randn(B, T, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(T, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    got = m(x, cos, sin)
    for b in range(B):
        want = diff2_attention_reference(
            x[b],
            _weights(m),
            h=n_heads,
            h_kv=n_kv_heads or n_heads,
            d=cfg.head_dim,
            rotary_dim=cfg.rotary_dim,
            theta=cfg.rope_theta,
            interleaved=interleaved,
        )
        torch.testing.assert_close(got[b].detach(), want, atol=1e-10, rtol=1e-9)


def test_triton_backend_runs_the_sdpa_path():
    cfg, sdpa = _module(8, 4)
    _, triton = _module(8, 4, backend="triton")
    x = torch.randn(1, 9, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(9, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    torch.testing.assert_close(triton(x, cos, sin), sdpa(x, cos, sin), atol=0, rtol=0)


def test_pairs_share_their_kv_head():
    """With GQA n_rep=2 (h=8, h_kv=4), output head i reads kv head i // 2 only: changing kv head 1's keys changes
    output heads 2 and 3 and leaves the others exactly alone."""
    cfg, m = _module(8, 4)
    d = cfg.head_dim
    x = torch.randn(1, 10, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(10, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    captured = []
    m.out_proj.register_forward_hook(lambda mod, inp, out: captured.append(inp[0].view(1, 10, 8, d)))
    m(x, cos, sin)
    with torch.no_grad():
        m.k_proj.weight[d : 2 * d] += torch.randn(d, cfg.d_model, dtype=torch.float64)
    m(x, cos, sin)
    before, after = captured
    changed = [(before[:, :, i] - after[:, :, i]).abs().max().item() > 1e-6 for i in range(8)]
    assert changed == [False, False, True, True, False, False, False, False]


def test_lambda_is_per_token_and_per_head():
    cfg, m = _module(4, None)
    x = torch.randn(2, 8, cfg.d_model, dtype=torch.float64)
    cos, sin = rotary_cos_sin(8, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64)
    m(x, cos, sin).square().mean().backward()
    grad = m.lambda_proj.weight.grad
    assert grad.shape == (4, cfg.d_model) and (grad.abs().sum(dim=1) > 0).all()  # every head's row learns


def test_parameter_count_by_hand():
    """E=1024, h=16, d=64: q 1024 x 2048, k and v 1024 x 1024 (MHA) or 1024 x 512 (8 kv heads), out 1024 x 1024,
    lambda_proj 1024 x 16 -> 2,097,152 + 2 x 1,048,576 + 1,048,576 + 16,384 = 5,259,264; GQA 4,210,688."""
    mha = Diff2Attention(ModelConfig(arch="diff2", d_model=1024, n_heads=16), depth=0)
    gqa = Diff2Attention(ModelConfig(arch="diff2", d_model=1024, n_heads=16, n_kv_heads=8), depth=0)
    assert sum(p.numel() for p in mha.parameters()) == 5_259_264
    assert sum(p.numel() for p in gqa.parameters()) == 4_210_688
    assert {n for n, _ in mha.named_parameters()} == {
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "out_proj.weight",
        "lambda_proj.weight",
    }


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="model.n_kv_heads: 3 does not divide n_heads=8"):
        ModelConfig(arch="diff2", d_model=64, n_heads=8, n_kv_heads=3)
