"""Whole-model behaviour: backends agree, causality, flash on GPU, configs reject bad keys."""
import pytest
import torch

from diffllm.config import build
from diffllm.model import DecoderLM, ModelConfig
from diffllm.model.attention import flash_available

ARCHS = ["transformer", "diff"]


def _model(arch, backend="sdpa", **kw):
    cfg = ModelConfig(arch=arch, d_model=64, n_layers=3, n_heads=8, n_kv_heads=4, vocab_size=101,
                      attn_backend=backend, rope_interleaved=arch == "diff", **kw)
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
