"""Multi-head Latent Attention (`arch: mla`) against an independent float64 implementation of DeepSeek-V2's equations
(tests/model/reference.py, loops over heads); the absorbed decode form equals the plain form; the KV cache holds only
c_KV and the RoPE key; parameters and FLOPs by hand. Cached decoding, document masks, eager/sdpa agreement, causality
and KV bytes are checked with every other variant (test_kv_cache.py, test_doc_mask.py, test_model.py,
test_kv_bytes.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from diffllm.model import DecoderLM, KVCache, ModelConfig
from diffllm.model.accounting import kv_cache_bytes_per_token, model_stats
from diffllm.model.kernels import flash_form_on_cpu
from diffllm.model.layers import rotary_cos_sin
from diffllm.model.mla_attention import MLAAttention
from diffllm.model.presets import load_preset

from .checklist import train_resume_evaluate_export
from .reference import mla_attention_reference

# (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim): every width different, so a swapped
# split shows; full-rank and low-rank queries
SHAPES = [(None, 24, 12, 6, 10), (20, 24, 12, 6, 10), (None, 16, 8, 4, 8)]


def _module(dims, interleaved=True, backend="sdpa", n_heads=4):
    dq, dc, dn, dr, dv = dims
    cfg = ModelConfig(
        arch="mla",
        d_model=32,
        n_layers=2,
        n_heads=n_heads,
        rope_interleaved=interleaved,
        attn_backend=backend,
        rope_theta=500.0,
        q_lora_rank=dq,
        kv_lora_rank=dc,
        qk_nope_head_dim=dn,
        qk_rope_head_dim=dr,
        v_head_dim=dv,
    )
    torch.manual_seed(sum(d or 0 for d in dims))
    m = MLAAttention(cfg, depth=1).double()
    with torch.no_grad():
        for p in m.parameters():  # norm weights away from 1 too
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return cfg, m


def _weights(m) -> dict:
    names = {"q": "q_proj", "dq": "q_a_proj", "q_norm": "q_a_layernorm", "uq": "q_b_proj"}
    names |= {"dkv": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "ukv": "kv_b_proj", "out": "out_proj"}
    return {k: getattr(m, n).weight.detach() for k, n in names.items() if hasattr(m, n)}


def _inputs(cfg, T=11, B=2):
    x = torch.randn(B, T, cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    return (x, *rotary_cos_sin(T, cfg.rotary_dim, cfg.rope_theta, x.device, torch.float64))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "sdpa-gpu-form"])
@pytest.mark.parametrize("dims,interleaved", [(SHAPES[0], True), (SHAPES[1], False), (SHAPES[2], True)])
def test_matches_float64_reference_from_the_paper(backend, dims, interleaved):
    """sdpa-gpu-form: a GPU's call (kernels.flash_form_on_cpu), the values zero-padded to the query width."""
    cfg, m = _module(dims, interleaved, backend.removesuffix("-gpu-form"))
    x, cos, sin = _inputs(cfg)
    assert cos.shape[-1] == dims[3] // 2  # the model's rotary covers the decoupled RoPE width only
    with flash_form_on_cpu() if backend.endswith("-gpu-form") else contextlib.nullcontext():
        got = m(x, cos, sin)
    for b in range(x.shape[0]):
        want = mla_attention_reference(x[b], _weights(m), cfg.n_heads, dims, cfg.rope_theta, interleaved)
        torch.testing.assert_close(got[b].detach(), want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("dims", SHAPES)
def test_absorbed_form_equals_the_plain_form(backend, dims):
    """W_UK folded into the queries and W_UV into the output, attending over the latent, gives the plain output."""
    cfg, m = _module(dims, backend=backend)
    x, cos, sin = _inputs(cfg)
    q_nope, q_rope = m.queries(x, cos, sin)
    c, k_rope = m.latent(x, cos, sin)
    absorbed = m.finish(x, m.attend_absorbed(x, q_nope, q_rope, c, k_rope, None))
    torch.testing.assert_close(absorbed, m(x, cos, sin), atol=1e-12, rtol=1e-10)


def test_the_cache_holds_only_the_latent_and_the_rope_key():
    cfg = ModelConfig(arch="mla", d_model=64, n_layers=3, n_heads=8, vocab_size=97, kv_lora_rank=20)
    torch.manual_seed(0)
    model = DecoderLM(cfg).double().eval()
    cache = KVCache(max_len=9)
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :4], cache)] + [model(tokens[:, t : t + 1], cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=0)  # absorbed decode = plain forward
    assert [(layer.k.shape, layer.v.shape) for layer in cache.layers] == [((2, 1, 9, 20), (2, 1, 9, 4))] * 3
    assert kv_cache_bytes_per_token(cfg) == 3 * (20 + 4) * 2


def test_parameters_flops_and_kv_bytes_by_hand_at_1_4b():
    """mla-1.4b: E 2048, 16 heads of d 128, so d_c 512, d_n 128, d_r 64, d_v 128 and a full W_Q."""
    cfg = load_preset("mla-1.4b")
    E, H, L, T = 2048, 16, 24, 2048
    w_q, w_dkv, norm, w_ukv, w_o = E * H * 192, E * (512 + 64), 512, 512 * H * 256, H * 128 * E
    assert MLAAttention.attention_params(cfg) == w_q + w_dkv + norm + w_ukv + w_o == 13_763_072
    s = model_stats(cfg, T)
    assert s.flops_per_token == 6 * s.matmul_params + 3 * L * 2 * T * H * (128 + 64 + 192)  # v padded to 192 on a GPU
    cfg.attn_backend = "eager"  # the materialised maps multiply the 128-wide values
    assert model_stats(cfg, T).flops_per_token == 6 * s.matmul_params + 3 * L * 2 * T * H * (128 + 64 + 128)
    assert s.kv_bytes_per_token == L * (512 + 64) * 2 == 27_648  # 14% of the Transformer's 196,608
    mha = load_preset("transformer-1.4b")
    assert s.total_params - model_stats(mha).total_params == L * (13_763_072 - 4 * E * E)


@pytest.mark.parametrize("dims", SHAPES)
def test_attention_params_by_hand_match_the_module(dims):
    for bias in (False, True):
        cfg, m = _module(dims)
        cfg.qkv_bias = bias
        module = MLAAttention(cfg, 0)
        assert sum(p.numel() for p in module.parameters()) == MLAAttention.attention_params(cfg), (dims, bias)


def test_bad_widths_are_one_line_errors():
    with pytest.raises(ValueError, match=r"model.qk_rope_head_dim: must be even and positive .* got 5"):
        ModelConfig(arch="mla", qk_rope_head_dim=5)
    with pytest.raises(ValueError, match=r"model.kv_lora_rank: must be positive \(or null\), got 0"):
        ModelConfig(arch="mla", kv_lora_rank=0)


@pytest.mark.slow
def test_tiny_mla_run_trains_resumes_evaluates_and_exports(tokenizer, tmp_path):
    """The checklist with low-rank queries, exported as remote code (the transformers model runs the plain form)."""
    cfg = train_resume_evaluate_export("mla-tiny", tmp_path, "model.q_lora_rank=48")
    assert (cfg.arch, cfg.q_lora_rank, cfg.rotary_dim) == ("mla", 48, 8)
