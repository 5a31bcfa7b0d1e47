"""`scaling fit holdout=<size or budget>`: the held-out runs are left out of the fits and predicted from them
(L(N) at the L(N) budget, else L(N, D)); error = predicted - measured, covered = inside the prediction's interval."""

from __future__ import annotations

import pytest

from diffllm.results import collect
from diffllm.scaling.fit import JointLaw
from diffllm.scaling.report import ScalingConfig, fit_sweep, render
from tests.distributed import cli_here
from tests.scaling.synthetic import DOC_LAWS, write_law_sweep

LAWS = {a: JointLaw(*p) for a, p in DOC_LAWS.items()}


def test_holdout_size_is_predicted_by_l_of_n_fitted_without_it(tmp_path):
    write_law_sweep(tmp_path / "s", LAWS, seeds=lambda size: (1, 2), noise=0.002)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=30, joint="none", holdout="micro-4")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    assert {f.points for f in result["power_law"]} == {6} and result["fit_runs"] == 12  # sizes 1-3 only
    assert result["power_law_with_undertrained"] is None  # held-out runs are not "excluded under-trained" ones
    rows = result["holdout"]
    assert len(rows) == 4 and {w["size"] for w in rows} == {"micro-4"} and {w["law"] for w in rows} == {"L(N)"}
    runs = {(r.arch, r.seed): r for r in collect(cfg.sweep_dir) if r.model.endswith("micro-4")}
    laws = {f.arch: f.law for f in result["power_law"]}
    for w in rows:
        r = runs[(w["series"], w["seed"])]
        assert w["measured"] == r.final_val_loss
        assert w["predicted"] == pytest.approx(float(laws[w["series"]](r.block_params)), rel=1e-12)
        assert w["error"] == pytest.approx(w["predicted"] - w["measured"], abs=1e-12)
        assert w["covered"] == (w["low"] <= w["measured"] <= w["high"])
    md = render(result)
    assert "Held out (holdout=micro-4): fitted without these runs" in md and "| transformer | micro-4 | 524,288 |" in md


def test_holdout_budget_is_predicted_by_the_joint_fit(tmp_path):
    write_law_sweep(tmp_path / "s", LAWS, budgets=(524288, 1048576, 2097152), noise=0.002)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, holdout="2097152")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    rows = result["holdout"]
    assert len(rows) == 8 and {w["tokens"] for w in rows} == {2097152} and {w["law"] for w in rows} == {"L(N, D)"}
    assert result["joint_mode"] == "final"
    runs = {(r.arch, r.model, r.seed): r for r in collect(cfg.sweep_dir) if r.tokens == 2097152}
    for w in rows:
        r = runs[(w["series"], f"{w['series']}-{w['size']}", w["seed"])]
        law = JointLaw(**result["joint"][w["series"]]["law"])  # fitted on 0.5M and 1M only
        assert w["predicted"] == pytest.approx(float(law(r.block_params, 2097152)), rel=1e-12)
        assert w["error"] == pytest.approx(w["predicted"] - r.final_val_loss, abs=1e-12)


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_holdout_that_matches_nothing_is_one_line(tmp_path):
    write_law_sweep(tmp_path / "s", LAWS, noise=0.002)
    done = cli_here("scaling", "fit", f"sweep_dir={tmp_path}/s", "holdout=micro-9")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "diffllm scaling fit: error: holdout=micro-9: no fitted run has this size or budget (sizes: micro-1, "
        "micro-2, micro-3, micro-4; budgets: 524288)"
    )


def test_holdout_with_nothing_fitted_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Three sizes, micro-3 held out: two sizes cannot identify L(N) or L(N, D), so nothing predicts the held-out runs.
    That was exit 0 with "0/0 inside their 90% interval, worst |error| nan" (issue 56); now it is refused as predict=
    refuses it: one line, exit code 2, nothing written."""
    from diffllm.cli import main

    write_law_sweep(tmp_path / "s", LAWS, sizes=(1, 2, 3), seeds=lambda size: (1, 2), noise=0.002)
    monkeypatch.setattr("sys.argv", ["diffllm"])
    with pytest.raises(SystemExit) as e:
        main(["scaling", "fit", f"sweep_dir={tmp_path}/s", f"out={tmp_path}/out", "holdout=micro-3", "reps=20"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (
        "diffllm scaling fit: error: holdout=micro-3: no fit to predict the held-out runs from (L(N) for transformer: "
        "no fit (refused: 4 points at 2 sizes; L(N) needs >= 4 points at >= 3 sizes to be identified))\n"
    )
    assert not (tmp_path / "out").exists()


def test_fits_md_marks_as_fitted_only_runs_of_a_fit_that_was_made(tmp_path):
    """Two sizes: no L(N) fit is made, so no run is marked "fitted" and the header says no fit was made (issue 56: every
    row read "fitted" under "No L(N) fit was made"). At three sizes, the L(N) budget's runs are the fitted ones, and a
    budget no fit used (joint=none) is not."""
    write_law_sweep(tmp_path / "two", LAWS, sizes=(1, 2), seeds=lambda size: (1, 2), noise=0.002)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "two"), reps=20, joint="none")
    md = render(fit_sweep(cfg, collect(cfg.sweep_dir)))
    runs = md.split("Runs (* selected; fitted: in a fit that was made;")[1].splitlines()[4:]
    assert len(runs) == 8 and all(line.endswith("| * |") for line in runs), runs
    assert md.startswith("No fit was made from the 8 of 8 finished runs given to the fits (the notes say why);")
    write_law_sweep(tmp_path / "three", LAWS, sizes=(1, 2, 3), budgets=(524288, 1048576), seeds=lambda n: (1, 2))
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "three"), reps=20, joint="none", tokens=1048576)
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    marks = {(w["size"], w["tokens"], w["seed"]): w["fitted"] for w in result["runs_table"] if w["series"] == "diff"}
    assert marks == {(f"micro-{n}", t, s): t == 1048576 for n in (1, 2, 3) for t in (524288, 1048576) for s in (1, 2)}
    assert result["fit_runs"] == 12 and result["fit_inputs"] == 24
    assert render(result).startswith("Fits over 12 of 24 finished runs;")
