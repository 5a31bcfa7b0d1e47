"""Preset sizes: StableLM-3B exact, paper presets within 2% of their names, every variant's accounting against hand
formulas; presets compose from their arch/ and size/ bases; `diffllm info` answers for 13.1B and lists every variant."""

import pytest

from diffllm.config import compose
from diffllm.model import variants
from diffllm.model.accounting import model_stats
from diffllm.model.info import table
from diffllm.model.presets import load_preset, preset_names
from tests.distributed import cli_here

PAPER = {"830m": 830e6, "1.4b": 1.4e9, "2.8b": 2.8e9, "6.8b": 6.8e9, "13.1b": 13.1e9}
SIZES = [*PAPER, "3b", "tiny", "small", "micro-1", "micro-2", "micro-3", "micro-4"]


def test_stablelm_3b_is_exact():
    assert model_stats(load_preset("transformer-stablelm-3b")).total_params == 2_795_443_200


@pytest.mark.parametrize("arch", ["transformer", "diff"])
@pytest.mark.parametrize("size", PAPER)
def test_paper_presets_match_their_names(arch, size):
    """Size = non-embedding parameters + the output head (the input lookup table is not counted), which is how
    Table 10's names come out; the untied input embedding adds 100,288 x d_model on top."""
    stats = model_stats(load_preset(f"{arch}-{size}"))
    assert abs(stats.nonembedding_params / PAPER[size] - 1) < 0.02


@pytest.mark.parametrize("arch", list(variants()))
@pytest.mark.parametrize("size", SIZES)
def test_every_variant_has_every_size_with_the_same_shape(arch, size):
    """A variant's preset differs from the Transformer's of the same size in its attention only."""
    t, v = load_preset(f"transformer-{size}"), load_preset(f"{arch}-{size}")
    assert (v.arch, v.name) == (arch, f"{arch}-{size}")
    same = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "norm", "max_seq_len")
    assert [getattr(v, k) for k in same] == [getattr(t, k) for k in same]
    extra = model_stats(v).total_params - model_stats(t).total_params
    assert extra == v.n_layers * (v.variant.attention_params(v) - t.variant.attention_params(t))


def test_extra_parameters_by_hand():
    for size in PAPER:
        t, d, d2 = (load_preset(f"{a}-{size}") for a in ("transformer", "diff", "diff2"))
        total = {c.arch: model_stats(c).total_params for c in (t, d, d2)}
        assert total["diff"] - total["transformer"] == d.n_layers * 6 * d.head_dim  # 4 lambda vectors + 2d subln
        E, h = d2.d_model, d2.n_heads  # V2: the second query half (E x E) and lambda_proj (E x h) per layer
        assert total["diff2"] - total["transformer"] == d2.n_layers * (E * E + E * h)


def test_cpu_presets_are_small():
    for arch in variants():
        for size in ("tiny", "small"):
            assert 1e6 <= model_stats(load_preset(f"{arch}-{size}")).total_params <= 20e6


def test_attention_flops_by_backend():
    """PaLM convention, 6 N + attention: Transformer 12 L T E; Diff 24 L T E on sdpa and flash (a GPU's four calls of
    head dim d: each component's scores against each half of V, tests/model/test_kernel_calls.py), 12 L T E when
    (P1 - lambda P2) V is one matmul (eager), 14 L T E for the fused triton kernel (its single-pass forward multiplies
    each map by V; its backward works on P1 - lambda P2); Diff V2 with 2h query heads 24 L T E on every backend."""
    T = 4096
    per_arch = {}
    for arch, factor in (("transformer", 12), ("diff", 24), ("diff2", 24)):
        cfg = load_preset(f"{arch}-3b")
        s = model_stats(cfg, T)
        assert s.flops_per_token == 6 * s.matmul_params + factor * cfg.n_layers * T * cfg.d_model
        per_arch[arch] = s
    for backend, factor in (("eager", 12), ("triton", 14)):
        d = load_preset("diff-3b")
        d.attn_backend = backend
        s = model_stats(d, T)
        assert s.flops_per_token == 6 * s.matmul_params + factor * d.n_layers * T * d.d_model
    assert model_stats(load_preset("transformer-3b"), T).flops_per_token < per_arch["diff"].flops_per_token


def test_unknown_preset_is_a_one_line_error():
    with pytest.raises(ValueError, match="model=gpt5: unknown preset"):
        load_preset("gpt5")
    with pytest.raises(ValueError, match="model=dif2-tiny: unknown preset \\(did you mean diff2-tiny"):
        load_preset("dif2-tiny")
    assert "diff-13.1b" in preset_names() and "diff2-13.1b" in preset_names()
    assert not [n for n in preset_names() if n in ("common", "tiny")]  # the bases are not presets


def test_command_line_overrides_reach_preset_fields_without_plus():
    cfg = compose("train", ["model=diff-1.4b", "model.lambda_init=0.8", "model.norm_eps=1e-6"]).model
    assert (cfg.lambda_init, cfg.norm_eps, cfg.d_model, cfg.arch) == (0.8, 1e-6, 2048, "diff")
    assert compose("train", ["model=diff2-tiny"]).model.arch == "diff2"


def test_info_table_lists_every_preset_of_every_variant():
    rows = table([load_preset(n) for n in preset_names() if n.endswith(("-tiny", "-13.1b"))], None).splitlines()
    assert "| diff2-13.1b | diff2 | 5120 | 40 | 40 (40), 80 q | 128 |" in "\n".join(rows)
    assert "| diff-13.1b | diff | 5120 | 40 | 20 (20) | 128 |" in "\n".join(rows)
    assert {r.split(" | ")[1] for r in rows[2:]} == set(variants())


def test_info_cli_answers_for_13b():
    done = cli_here("info", "model=diff-13.1b")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "13,096,627,200" in out and "GiB" in out
