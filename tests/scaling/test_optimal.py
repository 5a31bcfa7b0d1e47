"""Compute-optimal fits against closed forms: the joint fit recovers a known L(N, D); the frontier's N_opt(C), D_opt(C)
and exponents equal Chinchilla's closed form for f(N) = 6N; the compute ratio at equal loss of two series whose laws
differ by a known factor in compute is that factor; a series that never reaches the baseline's loss gives inf with a
note; `scaling fit` counts C from each run's own FLOPs per token (model_stats at its seq_len) and reports it all."""

from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from diffllm.model.accounting import model_stats
from diffllm.model.presets import load_preset
from diffllm.results import collect, kaplan_n
from diffllm.scaling.fit import JointLaw, bootstrap_joint, fit_joint, interval
from diffllm.scaling.optimal import FlopsPerToken, SeriesRuns, compute_optimal, compute_to_reach, exponents, frontier
from diffllm.scaling.report import ScalingConfig, fit_sweep, render, write_report
from tests.scaling.synthetic import write_law_sweep

CHINCHILLA = JointLaw(1.69, 406.4, 0.34, 410.7, 0.28)
SIZES, BUDGETS = np.geomspace(1e7, 1e9, 4), np.geomspace(1e9, 1e11, 4)
SIX_N = FlopsPerToken.fit(SIZES, 6 * SIZES)


def grid(law: JointLaw, flops_per_param: float = 6.0, seeds: int = 1, noise: float = 0.0, rng_seed: int = 0):
    """Every (size, budget, seed) as a SeriesRuns with f = flops_per_param x N; losses law(N, D) x exp(noise)."""
    n, d = (a.ravel() for a in np.meshgrid(np.repeat(SIZES, seeds), BUDGETS, indexing="ij"))
    y = law(n, d) * np.exp(np.random.default_rng(rng_seed).normal(0, noise, len(n)))
    return SeriesRuns(n, d, flops_per_param * n, y)


def chinchilla_optimum(law: JointLaw, C):
    """Hoffmann et al. (2022) eq. 4 for C = 6 N D: N_opt = G (C/6)^(beta/(alpha+beta)),
    D_opt = G^-1 (C/6)^(alpha/(alpha+beta))."""
    G = (law.alpha * law.A / (law.beta * law.B)) ** (1 / (law.alpha + law.beta))
    s = law.alpha + law.beta
    return G * (np.asarray(C) / 6) ** (law.beta / s), (np.asarray(C) / 6) ** (law.alpha / s) / G


def test_joint_fit_recovers_the_law_exactly_and_with_noise():
    exact = grid(CHINCHILLA)
    f = fit_joint(exact.N, exact.D, exact.loss)
    for k, tol in (("E", 0.01), ("A", 0.01), ("alpha", 1e-3), ("B", 0.01), ("beta", 1e-3)):
        assert getattr(f, k) == pytest.approx(getattr(CHINCHILLA, k), rel=tol), k
    noisy = grid(CHINCHILLA, seeds=2, noise=0.003, rng_seed=1)
    best, boot = bootstrap_joint(noisy.N, noisy.D, noisy.loss, reps=30, seed=0)
    for k in ("E", "A", "alpha", "B", "beta"):
        iv = interval(getattr(best, k), [getattr(b, k) for b in boot], 0.95)
        assert iv.low <= getattr(CHINCHILLA, k) <= iv.high, (k, iv)
    assert (best.alpha, best.beta) == pytest.approx((0.34, 0.28), abs=0.03)


def test_frontier_is_chinchillas_closed_form_for_f_6n():
    C = np.geomspace(1e18, 1e22, 5)
    fr = frontier(CHINCHILLA, SIX_N, C)
    n_opt, d_opt = chinchilla_optimum(CHINCHILLA, C)
    np.testing.assert_allclose(fr.N_opt, n_opt, rtol=1e-4)
    np.testing.assert_allclose(fr.D_opt, d_opt, rtol=1e-4)
    np.testing.assert_allclose(fr.loss, CHINCHILLA(n_opt, d_opt), rtol=1e-9)
    a, b = exponents(fr)
    assert (a, b) == pytest.approx((0.28 / 0.62, 0.34 / 0.62), abs=1e-4)
    np.testing.assert_allclose(compute_to_reach(CHINCHILLA, SIX_N, fr.loss), C, rtol=1e-6)  # the inverse of L*(C)
    # and from a law fitted on the grid's points (inside the runs' compute: C from 6e16 to 6e20)
    runs = grid(CHINCHILLA)
    fitted = frontier(fit_joint(runs.N, runs.D, runs.loss), SIX_N, np.geomspace(6e16, 6e20, 5))
    np.testing.assert_allclose(fitted.N_opt, chinchilla_optimum(CHINCHILLA, fitted.C)[0], rtol=0.03)


def _fit_all(series: dict[str, SeriesRuns], reps: int = 8):
    fits = {s: bootstrap_joint(r.N, r.D, r.loss, reps=reps, seed=0) for s, r in series.items()}
    return {s: f[0] for s, f in fits.items()}, {s: f[1] for s, f in fits.items()}


@pytest.mark.parametrize("case", ["flops", "efficiency"])
@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_compute_ratio_of_a_known_factor(case, noise):
    """flops: the same law at 1.29x the FLOPs per token needs 1.29x the compute. efficiency: L'(N, D) = L(sN, sD) with
    f = 6N reaches any loss with 1/s^2 of the compute (s N and s D of the other's model at C' = C / s^2)."""
    s, k = 1.25, 1.29
    law = CHINCHILLA
    other = JointLaw(law.E, law.A * s**-law.alpha, law.alpha, law.B * s**-law.beta, law.beta)  # L(sN, sD)
    series = {
        "transformer": grid(law, seeds=2, noise=noise),
        "diff": grid(law if case == "flops" else other, 6 * k if case == "flops" else 6, 2, noise, 1),
    }
    expected = k if case == "flops" else 1 / s**2
    joint, boot = _fit_all(series, reps=12)
    table, notes, plot = compute_optimal(series, joint, boot, set(), "transformer", 0.9)
    ratio = table["series"]["diff"]["compute_ratio"]
    # 0.2% loss noise moves a ratio read on a frontier this flat (L* - E ~ C^-0.15) by ~5%: the interval says so
    assert ratio.value == pytest.approx(expected, rel=1e-3 if noise == 0 else 0.06)
    assert ratio.n_valid == 12 and ratio.high - ratio.low < 0.1 * expected
    if noise:
        assert ratio.low < expected < ratio.high
    assert table["C_ref"] == series["transformer"].C.max() and "compute_ratio" not in table["series"]["transformer"]
    assert not notes and set(plot.frontiers) == {"transformer", "diff"}


def test_a_series_that_never_reaches_the_baseline_loss_is_inf_with_a_note():
    worse = JointLaw(4.0, 406.4, 0.34, 410.7, 0.28)  # E above every loss the baseline reaches
    series = {"transformer": grid(CHINCHILLA), "diff": grid(worse)}
    joint, boot = _fit_all(series)
    table, notes, _ = compute_optimal(series, joint, boot, set(), "transformer", 0.9)
    ratio = table["series"]["diff"]["compute_ratio"]
    assert ratio.value == float("inf") and ratio.n_valid == 0 and "never (inf)" in str(ratio)
    assert any(n.startswith("compute-optimal diff: never reaches transformer's frontier loss") for n in notes)


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_scaling_fit_counts_each_runs_own_flops_and_reports_the_frontier(tmp_path):
    """Two archs over 4 sizes x 3 budgets at seq_len 64 (not the presets' 128): C of each run is model_stats' FLOPs
    per token at 64 x tokens; the compute-optimal table matches the frontier of the true laws; E, A, B have intervals;
    the plots are written."""
    t = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4)
    d = JointLaw(1.5, 60.0 * 0.7**0.35, 0.35, 900.0 * 0.8**0.4, 0.4)
    budgets = (262144, 1048576, 4194304)
    write_law_sweep(tmp_path / "sweep", {"transformer": t, "diff": d}, budgets, seq_len=64)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=40, select=None)
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    assert result["joint_mode"] == "final"
    for k in ("E", "A", "alpha", "B", "beta"):  # every parameter with an interval around a value near the truth
        iv = result["joint"]["transformer"][k]
        assert iv.low <= iv.value <= iv.high and iv.value == pytest.approx(getattr(t, k), rel=0.02), k
    opt = result["compute_optimal"]
    stats = {a: [model_stats(load_preset(f"{a}-micro-{s}"), 64) for s in (1, 2, 3, 4)] for a in ("transformer", "diff")}
    assert stats["diff"][0].flops_per_token != model_stats(load_preset("diff-micro-1")).flops_per_token
    assert opt["C_ref"] == stats["transformer"][-1].flops_per_token * budgets[-1]  # its largest run
    truth = {"transformer": t, "diff": d}
    f = {}
    for a in truth:
        n = [kaplan_n(s, load_preset(f"{a}-micro-1").tie_embeddings) for s in stats[a]]
        f[a] = FlopsPerToken.fit(n, [s.flops_per_token for s in stats[a]])
        assert opt["series"][a]["flops_per_token"]["f"] == [s.flops_per_token for s in stats[a]]
        ref = frontier(truth[a], f[a], opt["C_ref"])
        row = opt["series"][a]["at_ref"]
        assert row["N_opt"].value == pytest.approx(ref.N_opt[0], rel=0.02)
        assert row["loss"].value == pytest.approx(ref.loss[0], rel=1e-3)
    target = frontier(t, f["transformer"], opt["C_ref"]).loss
    true_ratio = compute_to_reach(d, f["diff"], target)[0] / opt["C_ref"]
    assert opt["series"]["diff"]["compute_ratio"].value == pytest.approx(true_ratio, rel=0.02)
    md = render(result)
    assert (
        "Compute-optimal: C = training FLOPs per token" in md and "| transformer | " in md.split("Compute-optimal")[1]
    )
    files = write_report(cfg, result, tmp_path / "out")
    for png in ("loss_vs_compute.png", "iso_flop.png"):
        assert tmp_path / "out" / png in files and matplotlib.image.imread(tmp_path / "out" / png).shape[0] > 300
    saved = json.loads((tmp_path / "out" / "fits.json").read_text())["compute_optimal"]
    assert saved["series"]["diff"]["compute_ratio"]["value"] == pytest.approx(true_ratio, rel=0.02)


def test_e_at_its_bound_is_said(tmp_path):
    """Points from a law with E < 0: the fit can only put E at its bound 0, and says so."""
    write_law_sweep(
        tmp_path / "sweep", {"transformer": JointLaw(-0.5, 60.0, 0.35, 900.0, 0.4)}, (262144, 524288, 1048576, 2097152)
    )
    result = fit_sweep(
        ScalingConfig(sweep_dir=str(tmp_path / "sweep"), reps=20, joint="final"), collect(tmp_path / "sweep")
    )
    assert result["joint"]["transformer"]["law"]["E"] == 0.0
    assert any(
        n.startswith("L(N, D) for transformer: E = 0 is the bound of the fit (E >= 0), not an estimate")
        for n in result["notes"]
    )
