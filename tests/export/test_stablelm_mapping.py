"""Our Transformer in StableLM layout equals Hugging Face's StableLmForCausalLM on the same weights."""
import pytest
import torch

from diffllm.export.stablelm import from_stablelm, stablelm_config_kwargs, to_stablelm
from diffllm.model import DecoderLM, ModelConfig

transformers = pytest.importorskip("transformers")


def _tiny_stablelm(backend):
    return ModelConfig(arch="transformer", d_model=128, n_layers=3, n_heads=4, ffn_dim=344, vocab_size=250,
                       norm="layernorm", rotary_pct=0.25, rope_theta=10000.0, max_seq_len=128, attn_backend=backend)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_same_logits_as_hf(backend, qkv_bias):
    cfg = _tiny_stablelm(backend)
    cfg.qkv_bias = qkv_bias
    torch.manual_seed(0)
    ours = DecoderLM(cfg).eval()
    with torch.no_grad():  # move norms and biases off their init so the comparison exercises them
        for name, p in ours.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    hf_cfg = transformers.StableLmConfig(**stablelm_config_kwargs(cfg), attn_implementation="eager")
    hf = transformers.StableLmForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(to_stablelm(ours.state_dict()), strict=False)
    assert not missing and not unexpected
    tokens = torch.randint(0, 250, (2, 64))
    with torch.no_grad():
        want = hf(tokens).logits
        got = ours(tokens)
    assert (got - want).abs().max().item() <= 1e-4
    assert want.std() > 0.1  # logits are not trivially equal


def test_names_round_trip():
    ours = DecoderLM(_tiny_stablelm("sdpa"))
    hf_names = to_stablelm(ours.state_dict())
    assert "model.layers.2.self_attn.o_proj.weight" in hf_names and "model.norm.bias" in hf_names
    assert from_stablelm(hf_names).keys() == ours.state_dict().keys()


def test_diff_is_not_exportable_as_stablelm():
    with pytest.raises(ValueError, match="model.arch"):
        stablelm_config_kwargs(ModelConfig(arch="diff", norm="layernorm"))
