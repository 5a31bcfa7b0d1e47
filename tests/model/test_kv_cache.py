"""The KV cache: for every registered architecture and backend, decoding with the cache (a chunked prefill, then one
token at a time) gives the logits of the full forward over the same tokens, and a full cache is a one-line error."""

from __future__ import annotations

import contextlib

import pytest
import torch

from diffllm.model import DecoderLM, KVCache, ModelConfig, variants
from diffllm.model.kernels import flash_form_on_cpu


def tiny(arch: str, backend: str, **kw) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, d_model=64, n_layers=3, n_heads=4, vocab_size=97, max_seq_len=32, attn_backend=backend, **kw
    )
    return DecoderLM(cfg).double().eval()


@pytest.mark.parametrize("backend", ["eager", "sdpa", "sdpa-gpu-form"])
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("arch", list(variants()))
def test_cached_decoding_equals_the_full_forward(arch, backend, gqa):
    """sdpa-gpu-form: the full forward and the prefill in the GPU's one-head-dim calls (kernels.flash_form_on_cpu;
    MLA's absorbed prefill pads its latent values), the decode steps as on every device."""
    gpu_form = backend.endswith("-gpu-form")
    model = tiny(
        arch, backend.removesuffix("-gpu-form"), n_kv_heads=2 if gqa else None, rope_interleaved=arch == "diff"
    )
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), flash_form_on_cpu() if gpu_form else contextlib.nullcontext():
        full = model(tokens)  # (2, 20, V)
        cache = KVCache(max_len=20)
        pieces = [model(tokens[:, :7], cache), model(tokens[:, 7:12], cache)]  # prefill, then a chunk of 5
        pieces += [model(tokens[:, t : t + 1], cache) for t in range(12, 20)]  # then one token at a time
    assert cache.pos == 20
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)


def test_a_full_cache_and_a_too_long_sequence_are_one_line_errors():
    model = tiny("diff", "sdpa")
    cache = KVCache(max_len=8)
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), cache)
        with pytest.raises(ValueError, match=r"KV cache full: 6 cached \+ 3 new tokens > its max_len 8"):
            model(torch.zeros(1, 3, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="sequence length 33 exceeds model.max_seq_len=32"):
            model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len must be positive"):
        KVCache(0)
