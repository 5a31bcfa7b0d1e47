"""`diffllm scaling coord-check`: the fitted slope of log mean|activation| on log width (5 widths, 16x) is flat under
mup and clearly positive under sp for every declared arch, so the check can fail; across depth (2-16 layers) it is flat
under completep and grows under mup; the CLI writes its table, json and plot, and a bad width list is one line on
stderr, exit 2."""

from __future__ import annotations

import json

import pytest

from diffllm.errors import UserError
from diffllm.model.config import ModelConfig
from diffllm.scaling.config import CoordCheckConfig
from diffllm.scaling.coord_check import coord_check
from tests.distributed import cli_here

SMALL = dict(n_layers=2, vocab_size=256, max_seq_len=64)
OWN = CoordCheckConfig(widths=[16, 32, 64, 128, 256], steps=3, batch_size=4, seq_len=32)


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2", "mla"])
def test_mup_is_flat_and_sp_is_not(arch):
    slopes = {p: coord_check(ModelConfig(arch=arch, parametrization=p, **SMALL), OWN)["slopes"] for p in ("sp", "mup")}
    assert max(abs(s) for s in slopes["mup"].values()) < 0.5, slopes["mup"]
    assert max(slopes["sp"].values()) > 1.0, slopes["sp"]  # the worst layer grows ~ width or faster
    assert slopes["sp"]["logits"] > slopes["mup"]["logits"] + 0.3, (slopes["sp"]["logits"], slopes["mup"]["logits"])


DEPTHS = CoordCheckConfig(depths=[2, 4, 8, 16], steps=8, lr=0.003, batch_size=4, seq_len=32)


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2"])
def test_completep_is_flat_across_depth_and_mup_is_not(arch):
    """2-16 layers at d_model 64, 8 steps of lr 0.003 (Diff at a constant lambda_init 0.8, as the ladder: its default
    schedule lowers the last layer's output with depth by design): under completep every |slope| on log depth < 0.3
    (measured <= 0.2); under mup (no depth rule) the residual stream grows about as the depth (measured 0.9-1.6)."""
    cfg = dict(SMALL, d_model=64, n_heads=8, lambda_init=0.8)
    slopes = {
        p: coord_check(ModelConfig(arch=arch, parametrization=p, **cfg), DEPTHS)["slopes"] for p in ("mup", "completep")
    }
    assert max(abs(s) for s in slopes["completep"].values()) < 0.3, slopes["completep"]
    assert min(slopes["mup"]["mid.residual"], slopes["mup"]["last.residual"]) > 0.7, slopes["mup"]
    assert {"embedding", "mid.attn", "mid.mlp", "mid.residual", "last.residual", "logits"} <= set(slopes["mup"])


def run(tmp_path, *args):
    return cli_here("scaling", "coord-check", *args, cwd=tmp_path)


@pytest.mark.slow  # five widths, a table, a plot
def test_cli_writes_table_json_and_plot(tmp_path):
    r = run(
        tmp_path,
        "model=diff-tiny",
        "model.n_layers=1",
        "model.vocab_size=128",
        "model.parametrization=mup",
        "widths=[16,32,64,128,256]",
        "steps=1",
        "batch_size=2",
        "seq_len=16",
        "out=cc",
    )
    assert r.returncode == 0, r.stderr
    assert "| block0.residual |" in r.stdout and "largest |slope|" in r.stdout
    result = json.loads((tmp_path / "cc" / "coord_check.json").read_text())
    assert result["parametrization"] == "mup" and result["widths"] == [16, 32, 64, 128, 256]
    assert set(result["values"]["logits"]) == {"16", "32", "64", "128", "256"}  # json keys
    assert all(len(v) == 2 for v in result["values"]["logits"].values())  # steps 0 and 1
    assert (tmp_path / "cc" / "coord_check.png").stat().st_size > 1000


def test_cli_bad_widths_one_line_exit_2(tmp_path):
    r = run(tmp_path, "model=transformer-tiny", "widths=[64,32]")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "widths: want >= 2 increasing positive integers, got [64, 32]" in r.stderr, r.stderr
    assert not (tmp_path / "coord-check").exists()


def test_widths_off_the_head_dim_are_refused():
    with pytest.raises(UserError, match=r"widths: \[20\] not a multiple of head_dim=8"):
        coord_check(ModelConfig(**SMALL), CoordCheckConfig(widths=[16, 20]))
