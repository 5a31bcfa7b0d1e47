"""The grouped-query presets (`<arch>-<size>-gqa`, configs/model/size/<size>-gqa.yaml): each builds, differs from its
MHA preset in n_kv_heads (and so in K/V projections) only, `info` lists them, and a tiny run of diff-tiny-gqa (Diff's
paired-head GQA, the paper's semantics) trains, resumes exactly after SIGTERM, evaluates and exports with logits equal
in transformers (slow). The other archs' GQA runs are trained, exported and decoded by tests/export (layouts
llama-interleaved-gqa and diff2, 2 kv heads) and every arch resumes exactly in tests/train/test_archs.py."""

from __future__ import annotations

import pytest
import torch

from diffllm.model import DecoderLM
from diffllm.model.accounting import model_stats
from diffllm.model.info import table
from diffllm.model.presets import load_preset, preset_names

from .checklist import train_resume_evaluate_export

# size -> kv heads: Llama-3-style groups of 4 at the paper sizes (2.8b: 20 heads, 4 kv heads, because 5 is odd and
# Diff pairs its key heads), half the heads at the CPU sizes
KV = {"micro-1": 2, "micro-2": 2, "micro-3": 2, "micro-4": 2, "tiny": 2}
KV |= {"830m": 4, "1.4b": 4, "2.8b": 4, "6.8b": 8, "13.1b": 10}
GQA_ARCHS = ("transformer", "diff", "diff2")


def test_every_gqa_preset_exists_once_per_arch_and_size():
    gqa = {n for n in preset_names() if n.endswith("-gqa")}
    assert {f"{a}-{s}-gqa" for a in GQA_ARCHS for s in KV} <= gqa


@pytest.mark.parametrize("arch", GQA_ARCHS)
@pytest.mark.parametrize("size", KV)
def test_gqa_preset_is_its_mha_preset_with_fewer_kv_heads(arch, size):
    mha, gqa = load_preset(f"{arch}-{size}"), load_preset(f"{arch}-{size}-gqa")
    assert (gqa.name, gqa.arch, gqa.n_kv_heads, mha.n_kv_heads) == (f"{arch}-{size}-gqa", arch, KV[size], None)
    assert {k: v for k, v in vars(gqa).items() if k not in ("name", "n_kv_heads")} == {
        k: v for k, v in vars(mha).items() if k not in ("name", "n_kv_heads")
    }
    # K and V projections shrink from h to h_kv heads of d in every layer (all three archs project K, V alike)
    saved = 2 * gqa.d_model * (gqa.n_heads - KV[size]) * gqa.head_dim
    assert mha.variant.attention_params(mha) - gqa.variant.attention_params(gqa) == saved


@pytest.mark.parametrize("arch", GQA_ARCHS)
def test_tiny_gqa_preset_builds_and_runs(arch):
    mha, gqa = load_preset(f"{arch}-tiny"), load_preset(f"{arch}-tiny-gqa")
    saved = gqa.n_layers * (mha.variant.attention_params(mha) - gqa.variant.attention_params(gqa))
    assert model_stats(mha).total_params - model_stats(gqa).total_params == saved > 0
    torch.manual_seed(0)
    model = DecoderLM(gqa)
    assert model.layers[0].attn.k_proj.weight.shape == (2 * 32, 128)  # 2 kv heads of d = 32
    assert model(torch.randint(0, 100, (2, 16))).shape == (2, 16, 8192)


def test_info_table_lists_the_gqa_presets_with_their_kv_heads():
    rows = table([load_preset(n) for n in preset_names() if n.endswith("1.4b-gqa")], None)
    assert "| transformer-1.4b-gqa | transformer | 2048 | 24 | 16 (4) | 128 |" in rows
    assert "| diff-1.4b-gqa | diff | 2048 | 24 | 8 (2) | 128 |" in rows
    assert "| diff2-1.4b-gqa | diff2 | 2048 | 24 | 16 (4), 32 q | 128 |" in rows


@pytest.mark.slow
def test_tiny_diff_gqa_run_trains_resumes_evaluates_and_exports(tokenizer, tmp_path):
    cfg = train_resume_evaluate_export("diff-tiny-gqa", tmp_path)
    assert (cfg.arch, cfg.n_kv_heads, cfg.n_heads) == ("diff", 2, load_preset("diff-tiny").n_heads)
