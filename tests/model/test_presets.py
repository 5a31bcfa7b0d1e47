"""Preset sizes: StableLM-3B exact, paper presets within 2% of their names; `diffllm info` answers for 13.1B."""
import subprocess
import sys

import pytest

from diffllm.info import load_preset, preset_names
from diffllm.model.accounting import model_stats

PAPER = {"830m": 830e6, "1.4b": 1.4e9, "2.8b": 2.8e9, "6.8b": 6.8e9, "13.1b": 13.1e9}


def test_stablelm_3b_is_exact():
    assert model_stats(load_preset("transformer-stablelm-3b")).total_params == 2_795_443_200


@pytest.mark.parametrize("arch", ["transformer", "diff"])
@pytest.mark.parametrize("size", PAPER)
def test_paper_presets_match_their_names(arch, size):
    """Size = non-embedding parameters + the output head (the input lookup table is not counted), which is how
    Table 10's names come out; the untied input embedding adds 100,288 x d_model on top."""
    stats = model_stats(load_preset(f"{arch}-{size}"))
    assert abs(stats.nonembedding_params / PAPER[size] - 1) < 0.02


def test_diff_adds_only_lambda_and_subln_parameters():
    for size in PAPER:
        t, d = load_preset(f"transformer-{size}"), load_preset(f"diff-{size}")
        extra = model_stats(d).total_params - model_stats(t).total_params
        assert extra == d.n_layers * 6 * d.head_dim  # 4 lambda vectors + the 2d subln weight per layer


def test_cpu_presets_are_small():
    for arch in ("transformer", "diff"):
        for size in ("tiny", "small"):
            assert 1e6 <= model_stats(load_preset(f"{arch}-{size}")).total_params <= 20e6


def test_diff_attention_flops_exceed_transformer():
    t, d = model_stats(load_preset("transformer-3b"), 4096), model_stats(load_preset("diff-3b"), 4096)
    assert d.flops_per_token > t.flops_per_token
    # 6N + 12 L T E for the Transformer (PaLM convention)
    cfg = load_preset("transformer-3b")
    assert t.flops_per_token == 6 * t.matmul_params + 12 * cfg.n_layers * 4096 * cfg.d_model


def test_unknown_preset_is_a_one_line_error():
    with pytest.raises(ValueError, match="model=gpt5: unknown preset"):
        load_preset("gpt5")
    assert "diff-13.1b" in preset_names()


def test_info_cli_answers_for_13b():
    out = subprocess.run([sys.executable, "-m", "diffllm.cli", "info", "model=diff-13.1b"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "13,096,627,200" in out and "GiB" in out
