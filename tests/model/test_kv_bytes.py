"""KV-cache cost: every variant's declared bytes per token (`kv_cache_width`, accounting.kv_cache_bytes_per_token)
equal the bytes a real KVCache holds after a greedy generation in bf16, MHA and GQA; hand values at 1.4B; `diffllm
info` and `diffllm plan` report them (plan: inference memory at context= and batch=)."""

from __future__ import annotations

import pytest
import torch

from diffllm.model import DecoderLM, KVCache, ModelConfig, variants
from diffllm.model.accounting import kv_cache_bytes_per_token, model_stats
from diffllm.model.info import table
from diffllm.model.presets import load_preset
from diffllm.scaling.planner import PlanConfig, make_plan, plan_dict, render
from tests.distributed import cli_here


def generated_cache(cfg: ModelConfig, prompt: int = 5, new: int = 6) -> KVCache:
    """Greedy generation (a prefill of `prompt` tokens, then `new` single tokens through the cache) in bf16."""
    torch.manual_seed(0)
    model = DecoderLM(cfg).to(torch.bfloat16).eval()
    cache = KVCache(max_len=prompt + new)
    tokens = torch.randint(0, cfg.vocab_size, (2, prompt))
    with torch.no_grad():
        logits = model(tokens, cache)
        for _ in range(new):
            logits = model(logits[:, -1:].argmax(-1), cache)
    assert cache.pos == prompt + new
    return cache


def cache_bytes_per_token(cache: KVCache) -> float:
    """What the cache holds, every tensor of every layer, per cached position of one sequence."""
    held = sum(t.nbytes for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor))
    return held / (cache.layers[0].k.shape[0] * cache.max_len)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("arch", list(variants()))
def test_declared_kv_bytes_equal_a_real_cache_after_generating(arch, n_kv_heads):
    cfg = ModelConfig(arch=arch, d_model=64, n_layers=3, n_heads=8, n_kv_heads=n_kv_heads, vocab_size=97)
    cache = generated_cache(cfg)
    assert len(cache.layers) == cfg.n_layers
    assert cache_bytes_per_token(cache) == kv_cache_bytes_per_token(cfg) == model_stats(cfg).kv_bytes_per_token


def test_kv_bytes_by_hand_at_1_4b():
    """24 layers, 16 heads of 128, bf16: K and V of every kv head. Diff caches 8 groups of two 128-wide key
    sub-heads and a 256-wide value, the same bytes; V2 caches the Transformer's kv heads."""
    mha = 24 * 2 * 16 * 128 * 2
    for arch in ("transformer", "diff", "diff2"):
        assert kv_cache_bytes_per_token(load_preset(f"{arch}-1.4b")) == mha == 196_608
        assert kv_cache_bytes_per_token(load_preset(f"{arch}-1.4b-gqa")) == mha // 4 == 49_152


def test_info_reports_kv_bytes_per_token():
    rows = table([load_preset("transformer-1.4b"), load_preset("diff-1.4b-gqa")], None)
    assert rows.splitlines()[0].endswith("| KV bytes/token |")
    assert rows.splitlines()[2].endswith("| 196,608 |") and rows.splitlines()[3].endswith("| 49,152 |")


def test_plan_adds_inference_memory_at_a_context_and_batch():
    cfg = load_preset("transformer-1.4b-gqa")
    p = make_plan(cfg, PlanConfig(context=8192, batch=4, zero_stage=1, offload=False, activation_checkpointing=True))
    assert p.kv_cache_bytes == 49_152 * 8192 * 4 == 1.5 * 2**30
    assert p.inference_bytes == 2 * model_stats(cfg).total_params + p.kv_cache_bytes
    assert "KV cache 1.50 GiB (49,152 B/token x 8,192 context x 4 batch)" in render(p)
    assert plan_dict(p)["inference"]["kv_cache_bytes"] == p.kv_cache_bytes
    default = make_plan(cfg, PlanConfig(zero_stage=1, offload=False, activation_checkpointing=True))
    assert (default.context, default.plan.batch) == (cfg.max_seq_len, 1)  # the training seq_len, one sequence
    with pytest.raises(ValueError, match="context=None, batch=0: need at least one token and one sequence"):
        make_plan(cfg, PlanConfig(batch=0))


@pytest.mark.slow
def test_cli_info_and_plan_print_kv_cache():
    def cli(*args):
        done = cli_here(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "KV bytes/token       49,152 (all 24 layers, bf16" in cli("info", "model=diff-1.4b-gqa")
    out = cli("plan", "model=diff-1.4b-gqa", "context=4096", "batch=2", "zero_stage=2", "offload=false")
    assert "KV cache 0.38 GiB (49,152 B/token x 4,096 context x 2 batch)" in out
