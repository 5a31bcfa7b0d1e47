"""Whole-model behaviour over every registered attention variant: backends agree, causality, flash on GPU, the
triton backend's contract, configs reject bad keys."""

import math
import sys
import types

import pytest
import torch

from diffllm.config import build
from diffllm.model import DecoderLM, ModelConfig, variants
from diffllm.model.kernels import flash_available, flash_form_on_cpu

ARCHS = list(variants())


def _model(arch, backend="sdpa", **kw):
    cfg = ModelConfig(
        arch=arch,
        d_model=64,
        n_layers=3,
        n_heads=8,
        n_kv_heads=4,
        vocab_size=101,
        attn_backend=backend,
        rope_interleaved=not variants()[arch].baseline,
        **kw,
    )
    torch.manual_seed(0)
    return DecoderLM(cfg)


@pytest.mark.parametrize("arch", ARCHS)
def test_eager_and_sdpa_agree(arch):
    eager, sdpa = _model(arch, "eager"), _model(arch, "sdpa")
    sdpa.load_state_dict(eager.state_dict())
    tokens = torch.randint(0, 101, (3, 40))
    logits = eager(tokens)
    assert logits.shape == (3, 40, 128)  # vocab 101 padded to 128
    torch.testing.assert_close(sdpa(tokens), logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_gpu_form_equals_eager_in_float64_with_its_gradients(arch):
    """What a GPU runs (kernels.flash_form_on_cpu: calls of one head dim, Diff's four, MLA's padded values; GQA groups
    of 8 query over 4 kv heads) gives eager's logits and every parameter gradient, float64, to rounding."""
    eager, gpu = _model(arch, "eager").double(), _model(arch, "sdpa").double()
    gpu.load_state_dict(eager.state_dict())
    tokens = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
    want = eager(tokens, targets=tokens)
    with flash_form_on_cpu():
        got = gpu(tokens, targets=tokens)
    want_grads = torch.autograd.grad(want, list(eager.parameters()))
    got_grads = torch.autograd.grad(got, list(gpu.parameters()))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for (name, _), a, b in zip(gpu.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_causality(arch, backend):
    model = _model(arch, backend)
    tokens = torch.randint(0, 101, (2, 24))
    t = 11
    changed = tokens.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 7) % 101
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=0, rtol=0)
    assert (a[:, t + 1] - b[:, t + 1]).abs().max() > 1e-3  # the change is visible from t+1 on


@pytest.mark.gpu
@pytest.mark.skipif(not flash_available(), reason="needs CUDA and flash-attn (pip install diffllm[gpu])")
@pytest.mark.parametrize("arch", ARCHS)
def test_flash_matches_sdpa_on_gpu(arch):
    ref = _model(arch, "sdpa").cuda().bfloat16()
    flash = _model(arch, "flash").cuda().bfloat16()
    flash.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, 101, (2, 256), device="cuda")
    torch.testing.assert_close(flash(tokens).float(), ref(tokens).float(), atol=3e-2, rtol=3e-2)


def test_flash_without_flash_attn_is_a_clear_error():
    if flash_available():
        pytest.skip("flash-attn is available here")
    with pytest.raises(RuntimeError, match="attn_backend=flash needs flash-attn"):
        _model("diff", "flash")(torch.randint(0, 101, (1, 8)))


def test_tied_embeddings_share_one_matrix():
    model = _model("transformer", tie_embeddings=True)
    assert model.lm_head.weight is model.tok_embeddings.weight


@pytest.mark.parametrize(
    "values,message",
    [
        ({"d_modle": 64}, "model.d_modle: unknown key"),
        ({"arch": "mamba"}, "model.arch: got 'mamba'"),
        ({"arch": "dif2"}, "model.arch: got 'dif2'.*did you mean 'diff2'"),
        ({"d_model": 64, "n_heads": 6}, "model.n_heads: 6 does not divide d_model=64"),
        ({"arch": "diff", "d_model": 96, "n_heads": 3}, "model.n_heads: diff needs even"),
        ({"attn_backend": "xformers"}, "model.attn_backend"),
        ({"d_model": "wide"}, "model.d_model: Value 'wide'"),
    ],
)
def test_bad_model_config_names_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        build(ModelConfig, values, "model")


def test_sequence_longer_than_max_seq_len_is_refused():
    model = _model("diff", max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_registry_holds_the_three_variants_with_their_metadata():
    assert ARCHS[:3] == ["transformer", "diff", "diff2"]  # the baseline first
    for arch, cls in variants().items():
        assert cls.arch == arch and cls.label and cls.color
    assert [v.baseline for v in variants().values()].count(True) == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_params_by_hand_match_the_module(arch):
    for kw in ({}, {"n_kv_heads": 2}, {"qkv_bias": True}):
        cfg = ModelConfig(arch=arch, d_model=96, n_heads=4, **kw)
        module = cfg.variant(cfg, 0)
        assert sum(p.numel() for p in module.parameters()) == cfg.variant.attention_params(cfg), kw


def test_state_dict_names_of_existing_models_are_unchanged():
    names = set(_model("transformer").state_dict()) | set(_model("diff").state_dict())
    attn = {n.split(".", 3)[-1] for n in names if n.startswith("layers.0.attn.")}
    assert attn == {
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
    assert {
        "tok_embeddings.weight",
        "norm.weight",
        "lm_head.weight",
        "layers.2.mlp.down_proj.weight",
        "layers.1.attn_norm.weight",
        "layers.1.mlp_norm.weight",
    } <= names


@pytest.mark.parametrize("arch", ["transformer", "diff2"])
def test_triton_runs_sdpa_for_single_call_attentions(arch):
    sdpa, triton = _model(arch, "sdpa"), _model(arch, "triton")
    tokens = torch.randint(0, 101, (2, 20))
    torch.testing.assert_close(triton(tokens), sdpa(tokens), atol=0, rtol=0)


def test_diff_triton_without_the_kernel_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffllm.model.triton_diff", None)  # makes the import fail as without triton
    with pytest.raises(RuntimeError, match=r"^attn_backend=triton needs the triton package \(pip install triton\)"):
        _model("diff", "triton")(torch.randint(0, 101, (1, 8)))


def _fused_reference(q, k, v, lam):
    """The kernel's contract (OWNERS.md) in float64 loops: q (B, 2h, T, d) component-major, k (B, 2g, T, d),
    v (B, g, T, 2d) -> (B, h, T, 2d); diff head i reads kv group i // (h/g)."""
    B, two_h, T, d = q.shape
    h, g = two_h // 2, k.shape[1] // 2
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = torch.empty(B, h, T, v.shape[-1], dtype=q.dtype)
    for b in range(B):
        for i in range(h):
            j = i // (h // g)
            maps = [
                torch.softmax((q[b, c * h + i] @ k[b, c * g + j].T / math.sqrt(d)).masked_fill(~causal, -math.inf), -1)
                for c in (0, 1)
            ]
            out[b, i] = (maps[0] - lam * maps[1]) @ v[b, j]
    return out


@pytest.mark.parametrize("n_kv_heads", [None, 4])
def test_diff_triton_hands_the_kernel_the_agreed_tensors(monkeypatch, n_kv_heads):
    """A float64 stand-in for diffllm.model.triton_diff that implements the agreed interface from its equations: the
    Diff model on backend triton must then equal the eager model (this checks our side of the contract)."""
    calls = []

    def fused(q, k, v, lam, docs=None):  # docs: the packed rows' Documents (none here)
        assert docs is None
        calls.append((q.shape, k.shape, v.shape, lam.dim(), lam.requires_grad))
        return _fused_reference(q, k, v, lam)

    monkeypatch.setitem(sys.modules, "diffllm.model.triton_diff", types.SimpleNamespace(fused_diff_attention=fused))
    cfg = dict(arch="diff", d_model=64, n_layers=2, n_heads=8, n_kv_heads=n_kv_heads, vocab_size=101)
    torch.manual_seed(0)
    eager = DecoderLM(ModelConfig(**cfg, attn_backend="eager")).double()
    triton = DecoderLM(ModelConfig(**cfg, attn_backend="triton")).double()
    triton.load_state_dict(eager.state_dict())
    tokens = torch.randint(0, 101, (2, 10))
    torch.testing.assert_close(triton(tokens), eager(tokens), atol=1e-10, rtol=1e-9)
    g = (n_kv_heads or 8) // 2
    assert calls[0] == ((2, 8, 10, 8), (2, 2 * g, 10, 8), (2, g, 10, 16), 0, True)
