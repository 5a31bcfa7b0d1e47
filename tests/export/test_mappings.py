"""The native mappings on random weights (fast, no training): our model equals transformers' StableLM, Llama and
DiffLlama on the converted weights for every head layout, rotary style, bias and lambda_init, both ways round; and
`choose_format` picks the exact class or says why not."""

import itertools

import pytest
import torch

from diffllm.export import diffllama, llama, stablelm
from diffllm.export.convert import from_hf_names, to_hf_names
from diffllm.export.hf import choose_format
from diffllm.model import DecoderLM, ModelConfig

transformers = pytest.importorskip("transformers")

CASES = [
    (stablelm, dict(arch="transformer", norm="layernorm", rotary_pct=0.25, qkv_bias=True, attn_backend="eager")),
    (stablelm, dict(arch="transformer", norm="layernorm", rotary_pct=0.5, rope_interleaved=True, n_kv_heads=2)),
    (llama, dict(arch="transformer", n_kv_heads=2, rope_interleaved=True, qkv_bias=True)),
    (llama, dict(arch="transformer", tie_embeddings=True, attn_backend="eager")),
] + [
    (diffllama, dict(arch="diff", n_heads=h, n_kv_heads=kv, rope_interleaved=inter, qkv_bias=bias, lambda_init=lam))
    for (h, kv), inter, bias, lam in itertools.product(
        [(4, 4), (8, 4), (8, 2)], [False, True], [False, True], [None, 0.5]
    )
]


def perturbed(cfg: ModelConfig) -> DecoderLM:
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():  # move norms, biases, subln and lambda off their init so the comparison exercises them
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("fmt,kw", CASES, ids=[f"{f.NAME}-{i}" for i, (f, _) in enumerate(CASES)])
def test_same_logits_as_hf_both_ways(fmt, kw):
    cfg = ModelConfig(d_model=64, n_layers=3, n_heads=kw.pop("n_heads", 4), vocab_size=250, max_seq_len=64, **kw)
    ours = perturbed(cfg)
    hf_cfg = fmt.hf_config(cfg)
    hf_cfg._attn_implementation = "eager"
    hf = getattr(transformers, fmt.HF_CLASS)(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(fmt.to_hf(cfg, ours.state_dict()), strict=False)
    assert not unexpected and all(k.endswith("inv_freq") for k in missing)
    tokens = torch.randint(0, 250, (2, 48))
    with torch.no_grad():
        want, got = hf(tokens).logits, ours(tokens)
    assert (got - want).abs().max().item() <= 1e-5 and want.std() > 0.1
    back_cfg, back = fmt.from_hf(hf_cfg, hf.state_dict())
    again = DecoderLM(back_cfg).eval()
    again.load_state_dict(back)
    with torch.no_grad():
        assert (again(tokens) - want).abs().max().item() <= 1e-5


def test_names_round_trip():
    ours = {
        k: v
        for k, v in DecoderLM(ModelConfig(arch="diff", norm="layernorm", vocab_size=250)).state_dict().items()
        if ".subln." not in k
    }  # DiffLlama has no subln weight: diffllama.py folds it into o_proj
    hf_names = to_hf_names(ours)
    assert "model.layers.3.self_attn.o_proj.weight" in hf_names and "model.norm.bias" in hf_names
    assert "model.layers.0.self_attn.lambda_q1" in hf_names
    assert from_hf_names(hf_names).keys() == ours.keys()


@pytest.mark.parametrize(
    "kw,picked",
    [
        (dict(arch="transformer", norm="layernorm", rotary_pct=0.25), "stablelm"),
        (dict(arch="transformer", rope_interleaved=True), "llama"),
        (dict(arch="transformer", rotary_pct=0.5), "remote"),
        (dict(arch="diff", rope_interleaved=True, lambda_init=0.3), "diffllama"),
        (dict(arch="diff", norm="layernorm", rotary_pct=0.25), "remote"),
        (dict(arch="diff", norm_eps=1e-6), "remote"),
    ],
)
def test_auto_picks_the_exact_class_else_remote(kw, picked):
    fmt, why = choose_format(ModelConfig(**kw))
    assert fmt.NAME == picked, why


def test_a_format_that_cannot_represent_the_model_says_why():
    with pytest.raises(
        ValueError,
        match=r"format=diffllama cannot represent this model exactly: DiffLlama rotates the "
        r"whole head, this model has rotary_pct=0.25; use format=remote",
    ):
        choose_format(ModelConfig(arch="diff", rotary_pct=0.25), "diffllama")
    with pytest.raises(
        ValueError,
        match=r"format=stablelm .* StableLM has standard attention, this model has "
        r"arch=diff",
    ):
        choose_format(ModelConfig(arch="diff"), "stablelm")
    with pytest.raises(ValueError, match="did you mean 'diffllama'"):
        choose_format(ModelConfig(arch="diff"), "difllama")
