"""MLA <-> transformers' native DeepseekV3ForCausalLM (dense MLPs only, diffllm/export/deepseek.py): equal logits for
full-rank and low-rank queries, interleaved and rotate-half RoPE, also through its latent KV cache (generate); the
import gives back our model exactly; what DeepseekV3 cannot express goes to format=remote."""

from __future__ import annotations

import pytest
import torch

from diffllm.export import deepseek
from diffllm.export.hf import choose_format
from diffllm.model import DecoderLM, ModelConfig

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV3ForCausalLM"):
    pytest.skip("this transformers has no DeepseekV3", allow_module_level=True)


def _ours(**kw) -> DecoderLM:
    cfg = ModelConfig(arch="mla", d_model=64, n_layers=2, n_heads=4, vocab_size=128, max_seq_len=64, **kw)
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():  # norm weights away from 1, so a norm left out or misplaced shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("q_lora_rank,interleaved", [(None, True), (24, False)])
def test_deepseek_v3_gives_our_logits_and_imports_back(q_lora_rank, interleaved):
    ours = _ours(q_lora_rank=q_lora_rank, rope_interleaved=interleaved, kv_lora_rank=40)
    assert choose_format(ours.cfg)[0] is deepseek
    hf_cfg = deepseek.hf_config(ours.cfg)
    hf = transformers.DeepseekV3ForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(deepseek.to_hf(ours.cfg, ours.state_dict()), strict=False)
    assert not [k for k in missing if not k.endswith("inv_freq")] and not unexpected
    assert all(type(layer.mlp).__name__ == "DeepseekV3MLP" for layer in hf.model.layers)  # no expert anywhere
    ids = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-5
        greedy = hf.generate(ids[:1, :5], max_new_tokens=8, do_sample=False, use_cache=True)
        mine = ids[:1, :5]
        for _ in range(8):
            mine = torch.cat((mine, ours(mine)[:, -1:].argmax(-1)), dim=1)
    assert greedy.tolist() == mine.tolist()
    cfg, sd = deepseek.from_hf(hf_cfg, hf.state_dict())
    back = DecoderLM(cfg).eval()
    back.load_state_dict(sd)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.rotary_dim, cfg.rope_interleaved) == (
        q_lora_rank,
        40,
        ours.cfg.rotary_dim,
        interleaved,
    )
    with torch.no_grad():
        assert torch.equal(back(ids), ours(ids))


def test_what_deepseek_v3_cannot_express_goes_remote():
    fmt, why = choose_format(_ours(qkv_bias=True).cfg)
    assert fmt.NAME == "remote" and "DeepseekV3 biases o_proj" in why
    with pytest.raises(ValueError, match="format=deepseek_v3 cannot represent this model exactly"):
        choose_format(_ours(norm="layernorm").cfg, "deepseek_v3")


def test_remote_export_rotates_mla_s_own_rope_width(tmp_path):
    """format=remote (what an MLA with qkv_bias gets): the bundle's model rotates qk_rope_head_dim dims (config.json
    `rotary_dim`), not rotary_pct of d, and gives our logits (before: cos/sin of d/2 pairs met an 8-wide RoPE part
    and the forward died)."""
    from diffllm.export.hf import FORMATS, write_hf

    ours = _ours(qkv_bias=True, rope_interleaved=False)
    assert ours.cfg.rotary_dim == 8 != int(ours.cfg.head_dim * ours.cfg.rotary_pct)
    write_hf(ours.cfg, ours.state_dict(), tmp_path, FORMATS["remote"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    ids = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-5
