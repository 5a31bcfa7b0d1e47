"""Scaling-law fits on synthetic points drawn from known laws: the fits recover the exponents, the intervals cover
the truth, the equal-loss ratios match their closed forms, and `scaling fit` runs end to end on synthetic run dirs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from diffllm.results import collect
from diffllm.scaling.fit import (
    JointLaw,
    PowerLaw,
    bootstrap_power_law,
    fit_joint,
    fit_power_law,
    interval,
    ratio_at_equal_loss,
)
from diffllm.scaling.report import ScalingConfig, fit_sweep, render, write_report
from tests.distributed import cli_here
from tests.scaling.synthetic import write_law_sweep

N = np.geomspace(1e5, 2e6, 6)


@pytest.mark.parametrize("law", [PowerLaw(1.69, 406.4, 0.34), PowerLaw(2.5, 80.0, 0.6), PowerLaw(0.0, 12.0, 0.076)])
def test_power_law_recovered_exactly_without_noise(law):
    f = fit_power_law(N, law(N))
    assert f.alpha == pytest.approx(law.alpha, rel=1e-3)
    assert f.E == pytest.approx(law.E, abs=1e-3)
    assert f.A == pytest.approx(law.A, rel=1e-2)


def test_power_law_with_noise_and_bootstrap_interval_covers_truth():
    truth = PowerLaw(1.8, 300.0, 0.45)
    rng = np.random.default_rng(3)
    n = np.repeat(N, 2)
    y = truth(n) * np.exp(rng.normal(0, 0.003, len(n)))
    best, boot = bootstrap_power_law(n, y, reps=300)
    iv = interval(best.alpha, [b.alpha for b in boot], 0.95)
    assert iv.low <= truth.alpha <= iv.high
    assert abs(best.alpha - truth.alpha) < 0.05 and iv.high - iv.low < 0.2


def test_joint_law_recovered():
    truth = JointLaw(1.69, 406.4, 0.34, 410.7, 0.28)  # Chinchilla's published fit
    n, d = (a.ravel() for a in np.meshgrid(np.geomspace(1e6, 1e9, 5), np.geomspace(1e8, 1e11, 5)))
    f = fit_joint(n, d, truth(n, d))
    assert (f.alpha, f.beta) == pytest.approx((truth.alpha, truth.beta), abs=0.01)
    assert f.E == pytest.approx(truth.E, abs=0.02)


def test_ratio_closed_form():
    t, d = PowerLaw(2.0, 50.0, 0.3), PowerLaw(2.0, 40.0, 0.3)  # same E and alpha: ratio = (A_d / A_t)^(1/alpha)
    assert ratio_at_equal_loss(t, d, 1e6) == pytest.approx((40 / 50) ** (1 / 0.3))
    assert ratio_at_equal_loss(t, PowerLaw(3.0, 40, 0.3), 1e6) == float("inf")  # never reaches the loss
    with pytest.raises(ValueError, match="needs >= 3 points"):
        fit_power_law([1e5, 1e5], [3.0, 3.1])


def _synthetic_sweep(root: Path, laws: dict[str, JointLaw], budget: int = 524288, noise: float = 0.002) -> None:
    """Run dirs as the trainer writes them (config.yaml's model, summary.json, metrics.jsonl), losses drawn from
    `laws`: sizes 1-4, one budget, two seeds at size 1."""
    write_law_sweep(root, laws, (budget,), lambda size: (1234, 1235) if size == 1 else (1234,), noise)


def test_scaling_fit_end_to_end(tmp_path):
    t = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4)
    d = JointLaw(1.5, 60.0 * 0.7**0.35, 0.35, 900.0 * 0.8**0.4, 0.4)  # N term as 70% of the params, D term 80%
    _synthetic_sweep(tmp_path / "sweep", {"transformer": t, "diff": d}, noise=0.001)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=60)
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    assert result["joint_mode"] == "curves"
    alphas = {f.arch: f.alpha for f in result["power_law"]}
    assert alphas["transformer"].low < alphas["transformer"].value < alphas["transformer"].high
    joint = result["joint"]
    assert joint["transformer"]["alpha"].value == pytest.approx(0.35, abs=0.08)
    assert joint["transformer"]["beta"].value == pytest.approx(0.4, abs=0.08)
    n_ref = max(r.block_params for r in collect(cfg.sweep_dir) if r.arch == "transformer")
    true_tokens = ratio_at_equal_loss(t.at_params(n_ref), d.at_params(n_ref), 524288)
    true_params = ratio_at_equal_loss(t.at_tokens(524288), d.at_tokens(524288), n_ref)  # both terms count here
    token_ratio = result["ratios"][f"tokens_at_N={n_ref},D=524288"]
    param_ratio = result["ratios"][f"params_from_joint_at_N={n_ref},D=524288"]
    assert token_ratio.value == pytest.approx(true_tokens, rel=0.05)
    assert param_ratio.value == pytest.approx(true_params, rel=0.15)
    assert result["ratios"][f"params_at_N={n_ref},D=524288"].value == pytest.approx(true_params, rel=0.15)
    files = write_report(cfg, result, tmp_path / "out")
    for png in [f for f in files if f.suffix == ".png"]:
        assert matplotlib.image.imread(png).shape[0] > 300
    assert "| transformer | 5 |" in (tmp_path / "out" / "fits.md").read_text()
    assert json.loads((tmp_path / "out" / "fits.json").read_text())["runs"] == 10


def scaling_fit(*args: str) -> subprocess.CompletedProcess:
    """`diffllm scaling fit <args>`, in this process (its exit code, stdout and stderr)."""
    return cli_here("scaling", "fit", *args)


def test_scaling_fit_cli_missing_dir(tmp_path):
    out = scaling_fit(f"sweep_dir={tmp_path}/nope")
    assert out.returncode == 2
    assert out.stderr.strip() == f"diffllm scaling fit: error: sweep_dir={tmp_path}/nope: no such directory"


def test_interval_counts_never_as_infinite():
    inf = float("inf")
    iv = interval(0.5, [0.4, 0.5, 0.6] + [inf] * 7, 0.9)
    assert (iv.low, iv.high, iv.n_valid, iv.n_total) == (0.4, inf, 3, 10)
    assert str(iv) == "0.5 [0.4, inf] (finite in 3/10)"


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_fits_below_the_minimum_are_refused_in_one_line(tmp_path):
    """Three sizes, one seed: 3 points for the 3 parameters of L(N) (it would pass through every point, with
    zero-width intervals). `scaling fit` refuses the fit in one line (>= 4 points at >= 3 sizes), draws no ratio from
    it, and says so on stderr."""
    t = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4)
    _synthetic_sweep(tmp_path / "sweep", {"transformer": t, "diff": t}, noise=0.0)
    for arch in ("transformer", "diff"):  # keep sizes 1-3 with one seed: 3 points
        shutil.rmtree(tmp_path / "sweep" / f"{arch}-micro-4")
        shutil.rmtree(tmp_path / "sweep" / f"{arch}-micro-1" / "524288" / "seed1235")
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=40, joint="none")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    assert result["power_law"] == [] and result["ratios"] == {}
    line = "L(N) for transformer: no fit (refused: 3 points at 3 sizes; L(N) needs >= 4 points at >= 3 sizes"
    assert any(n.startswith(line) for n in result["notes"])
    done = scaling_fit(f"sweep_dir={tmp_path}/sweep", "reps=20", "joint=none", f"out={tmp_path}/out")
    assert done.returncode == 0, done.stderr
    assert "warning: L(N) for diff: no fit (refused: 3 points at 3 sizes" in done.stderr


def test_a_parameter_at_its_bound_is_flagged_in_the_table(tmp_path):
    """Losses that ask for E < 0 (E = -0.3, B = 0): the fit lands on the bound E = 0, and the table flags it."""
    _synthetic_sweep(tmp_path / "sweep", {"transformer": JointLaw(-0.3, 60.0, 0.35, 0.0, 0.4)}, noise=0.0)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=20, joint="none")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    (fit,) = result["power_law"]
    assert fit.law.E == 0 and fit.flags == ("E=0",)
    md = render(result)
    assert "| series | points | E | A | alpha | at a bound |" in md
    assert [line for line in md.splitlines() if line.startswith("| transformer | 5 |")][0].endswith("| E=0 |")


def test_inverse_of_a_nearly_flat_law_is_never_not_an_overflow():
    """A bootstrap replicate can fit alpha ~ 0: the size that reaches a loss is then beyond any float (inf), as for a
    loss at or below E; an ordinary law inverts exactly."""
    from diffllm.scaling.fit import PowerLaw

    assert PowerLaw(3.0, 1.0, 1e-4).inverse(3.5) == float("inf")  # 2**10000
    assert PowerLaw(3.0, 1.0, 0.0).inverse(3.5) == float("inf")
    assert PowerLaw(3.0, 1.0, 0.5).inverse(2.9) == float("inf")
    assert PowerLaw(3.0, 8.0, 0.5).inverse(3.5) == pytest.approx(256.0, rel=1e-12)  # 8 x**-0.5 = 0.5


def test_too_few_points_say_why_first_and_make_no_empty_table(tmp_path):
    """Two points per series: no L(N) fit (3 parameters). fits.md opens with the reason, not with an empty table."""
    t = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4)
    _synthetic_sweep(tmp_path / "sweep", {"transformer": t, "diff": t}, noise=0.001)
    for arch in ("transformer", "diff"):
        for size in (3, 4):
            shutil.rmtree(tmp_path / "sweep" / f"{arch}-micro-{size}")
        shutil.rmtree(tmp_path / "sweep" / f"{arch}-micro-1" / "524288" / "seed1235")
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=20, joint="none")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    assert result["power_law"] == [] and result["notes"]
    md = render(result).splitlines()
    assert md[2].startswith("note: ")  # the reason, right after the header line
    assert "| series | points | E | A | alpha |" not in md and "No L(N) fit was made (the notes above say why)." in md


def test_an_optimum_outside_the_trained_sizes_is_flagged():
    from diffllm.scaling.fit import Interval
    from diffllm.scaling.optimal import _beyond

    sizes = (1e5, 4e5)
    assert _beyond(Interval(9e5, 5e5, 2e6, 10, 10), sizes) == " (FLAG: beyond the largest size)"
    assert _beyond(Interval(5e4, 1e4, 2e5, 10, 10), sizes) == " (FLAG: below the smallest size)"
    assert _beyond(Interval(2e5, 1e5, 3e5, 10, 10), sizes) == ""


def test_scaling_fit_reads_a_collected_runs_csv_without_its_run_folders(tmp_path):
    """`sweep_dir=<runs.csv>` (as the config's comment promises): the committed table of a sweep whose runs are not on
    this machine fits to the same power laws as the sweep folder itself."""
    from diffllm.results import to_csv

    t = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4)
    _synthetic_sweep(tmp_path / "sweep", {"transformer": t, "diff": t}, noise=0.001)
    table = tmp_path / "docs" / "runs.csv"
    table.parent.mkdir()
    table.write_text(to_csv(collect(tmp_path / "sweep"), table.parent))

    def fit(sweep_dir: Path, out: Path) -> dict:
        run = scaling_fit(f"sweep_dir={sweep_dir}", f"out={out}", "reps=20")
        assert run.returncode == 0, run.stderr
        return json.loads((out / "fits.json").read_text())

    from_folder = fit(tmp_path / "sweep", tmp_path / "a")
    shutil.rmtree(tmp_path / "sweep")
    from_csv = fit(table, tmp_path / "b")
    assert from_csv["runs"] == from_folder["runs"] == 10
    assert [f["law"] for f in from_csv["power_law"]] == [f["law"] for f in from_folder["power_law"]]
    assert any("none of its run folders is here" in n for n in from_csv["notes"])


def test_scaling_fit_refuses_a_csv_that_is_no_runs_table_in_one_line(tmp_path):
    bad = tmp_path / "notes.csv"
    bad.write_text("a,b\n1,2\n")
    out = scaling_fit(f"sweep_dir={bad}")
    assert out.returncode == 2
    assert out.stderr.strip().startswith(f"diffllm scaling fit: error: sweep_dir={bad}: not a runs.csv"), out.stderr
