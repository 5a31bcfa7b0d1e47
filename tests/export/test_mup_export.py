"""Export of a parametrization=mup model: the readout's 1/width_mult and the query scale are folded into the weights,
so transformers' logits on the exported directory equal ours (a native and a remote-code format)."""

from __future__ import annotations

import pytest
import torch

from diffllm.export import deepseek, diffllama, llama, remote
from diffllm.export.hf import choose_format, write_hf
from diffllm.model import DecoderLM, ModelConfig

transformers = pytest.importorskip("transformers")


GROWN_BY_HEAD_DIM = {"n_heads": 4, "base_head_dim": 4, "qkv_bias": True}  # head dim 16 from 4: queries x 1/2


@pytest.mark.parametrize(
    "arch,fmt,kw",
    [
        ("transformer", llama, GROWN_BY_HEAD_DIM),
        ("diff2", remote, GROWN_BY_HEAD_DIM),
        ("diff", diffllama, {**GROWN_BY_HEAD_DIM, "qkv_bias": False, "lambda_mup_scale": True}),  # lambda_q x 1/4
        # MLA grown by head dim: W_DQ a readout (x 1/4), queries x 1/2 folded into W_UQ; grown by heads: W_DQ and
        # W_DKV readouts (docs/model.md)
        ("mla", deepseek, {**GROWN_BY_HEAD_DIM, "qkv_bias": False, "q_lora_rank": 24, "kv_lora_rank": 40}),
        ("mla", deepseek, {"n_heads": 16, "q_lora_rank": 24}),
    ],
)
def test_exported_mup_logits_equal_ours(arch, fmt, kw, tmp_path):
    # width_mult 4: the readout x 1/4
    cfg = ModelConfig(
        **kw, arch=arch, d_model=64, n_layers=2, vocab_size=250, max_seq_len=64, parametrization="mup", base_width=16
    )
    assert choose_format(cfg)[0] is fmt
    torch.manual_seed(0)
    ours = DecoderLM(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    write_hf(cfg, ours.state_dict(), tmp_path, fmt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=fmt is remote).eval()
    tokens = torch.randint(0, 250, (2, 32))
    with torch.no_grad():
        want, got = ours(tokens), hf(tokens).logits
    sp = DecoderLM(ModelConfig(**{**cfg.__dict__, "parametrization": "sp"})).eval()
    sp.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (sp(tokens) - want).abs().max() > 0.1 * want.std()  # the fold is needed: sp on our weights differs
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


def test_tied_mup_export_is_refused(tmp_path):
    from diffllm.errors import UserError

    cfg = ModelConfig(
        d_model=64, n_heads=4, n_layers=1, vocab_size=100, tie_embeddings=True, parametrization="mup", base_width=16
    )
    with pytest.raises(UserError, match="tied embeddings cannot fold its readout scale"):
        write_hf(cfg, DecoderLM(cfg).state_dict(), tmp_path, llama)
