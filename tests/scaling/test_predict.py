"""`scaling fit predict=<size>@<tokens>` (issue 32 §4): a prediction for a size no run has, from L(N, D). Checked
against the laws that made the synthetic losses (noise-free: the fit recovers them, so the prediction is the true
law at the preset's N) and against `holdout=<size>` on the sweep that then holds the size (the same fit, so the
same predicted values); a size without a preset and a malformed spec are one-line errors."""

from __future__ import annotations

import pytest

from diffllm.errors import UserError
from diffllm.model.accounting import model_stats
from diffllm.model.presets import load_preset
from diffllm.results import collect, kaplan_n, to_csv
from diffllm.scaling.fit import JointLaw, fit_power_law
from diffllm.scaling.inputs import read_all
from diffllm.scaling.report import ScalingConfig, fit_sweep, render
from tests.distributed import cli_here
from tests.scaling.synthetic import DOC_LAWS, write_law_sweep

LAWS = {a: JointLaw(*p) for a, p in DOC_LAWS.items()}
BUDGETS, TOKENS = (524288, 1048576, 2097152), 4194304


def n_of(model: str) -> int:
    cfg = load_preset(model)
    return kaplan_n(model_stats(cfg), cfg.tie_embeddings)


def test_prediction_is_the_law_that_made_the_losses(tmp_path):
    write_law_sweep(tmp_path / "s", LAWS, budgets=BUDGETS, sizes=(1, 2, 3))
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, predict=f"micro-4@{TOKENS}")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    rows = {w["series"]: w for w in result["prediction"]}
    assert set(rows) == {"transformer", "diff"}
    for arch, law in LAWS.items():
        w = rows[arch]
        assert (w["preset"], w["N"], w["D"]) == (f"{arch}-micro-4", n_of(f"{arch}-micro-4"), TOKENS)
        assert w["loss"] == pytest.approx(float(law(w["N"], TOKENS)), rel=1e-4)
        assert w["loss_low"] <= w["loss"] <= w["loss_high"]
    truth = float(LAWS["diff"](rows["diff"]["N"], TOKENS)) - float(
        LAWS["transformer"](rows["transformer"]["N"], TOKENS)
    )
    assert rows["diff"]["gap"] == pytest.approx(truth, abs=1e-4) and truth < 0
    assert "baseline" not in rows["transformer"]
    md = render(result)
    assert f"Prediction (predict=micro-4@{TOKENS}), from L(N, D) before any run of this size" in md


def test_holdout_of_the_trained_size_scores_the_same_prediction(tmp_path):
    """Fit without micro-4 and predict it; then train it (here: write it) and hold it out: the same numbers."""
    kw = dict(laws=LAWS, budgets=BUDGETS, noise=0.003)
    write_law_sweep(tmp_path / "before", sizes=(1, 2, 3), **kw)
    before = fit_sweep(ScalingConfig(sweep_dir=str(tmp_path / "before"), reps=20, predict=f"micro-4@{BUDGETS[-1]}"),
                       collect(tmp_path / "before"))  # fmt: skip
    write_law_sweep(tmp_path / "after", sizes=(1, 2, 3), **kw)  # the same runs (same noise draws) ...
    write_law_sweep(tmp_path / "after", sizes=(4,), rng_seed=1, **kw)  # ... and the size, trained afterwards
    after = fit_sweep(ScalingConfig(sweep_dir=str(tmp_path / "after"), reps=20, holdout="micro-4", tokens=BUDGETS[0]),
                      collect(tmp_path / "after"))  # fmt: skip
    predicted = {w["series"]: w["loss"] for w in before["prediction"]}
    held = [w for w in after["holdout"] if w["tokens"] == BUDGETS[-1]]
    assert held and all(w["law"] == "L(N, D)" for w in held)
    for w in held:
        assert w["predicted"] == pytest.approx(predicted[w["series"]], rel=1e-12)


def test_bad_predict_specs_are_one_line(tmp_path):
    with pytest.raises(UserError, match="expected <size>@<tokens>"):
        ScalingConfig(predict="micro-4").validate()
    write_law_sweep(tmp_path / "s", LAWS, budgets=BUDGETS, sizes=(1, 2, 3))
    out = cli_here("scaling", "fit", f"sweep_dir={tmp_path}/s", "predict=micro-9@1M", "reps=20", f"out={tmp_path}/o")
    assert out.returncode != 0 and out.stderr.strip().splitlines()[-1] == (
        "diffllm scaling fit: error: predict: no preset diff-micro-9 (configs/model/diff-micro-9.yaml) "
        "to predict diff at size micro-9"
    ), out.stderr


def test_predict_beside_holdout_scores_the_prediction_and_the_naive_forecast(tmp_path):
    """`predict=micro-4@D holdout=micro-4` on the sweep that holds micro-4: each series' measured mean over its seeds,
    the measured gap paired by seed, coverage, and the naive forecast (the gap at micro-3, the largest fitted size, at
    its largest budget), each against the same arithmetic done here on the collected runs."""
    two = lambda size: (1, 2)  # noqa: E731
    write_law_sweep(tmp_path / "s", LAWS, budgets=BUDGETS, sizes=(1, 2, 3, 4), seeds=two, noise=0.01)
    runs = collect(tmp_path / "s")
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, predict=f"micro-4@{BUDGETS[-1]}", holdout="micro-4",
                        refuse_unidentified=False)  # fmt: skip
    result = fit_sweep(cfg, runs)
    rows = {w["series"]: w for w in result["prediction"]}

    def loss(arch: str, size: int, budget: int) -> dict:
        return {r.seed: r.final_val_loss for r in runs if r.model == f"{arch}-micro-{size}" and r.tokens == budget}

    for arch, w in rows.items():
        mine = loss(arch, 4, BUDGETS[-1])
        assert w["seeds"] == 2 and w["measured"] == pytest.approx(sum(mine.values()) / 2, abs=1e-12)
        assert w["covered"] == (w["loss_low"] <= w["measured"] <= w["loss_high"])
    d4, t4 = loss("diff", 4, BUDGETS[-1]), loss("transformer", 4, BUDGETS[-1])
    d3, t3 = loss("diff", 3, BUDGETS[-1]), loss("transformer", 3, BUDGETS[-1])
    diff = rows["diff"]
    g = sum(d4[s] - t4[s] for s in (1, 2)) / 2
    assert diff["measured_gap"]["paired"].value == pytest.approx(g, abs=1e-12)
    assert diff["naive_gap"] == pytest.approx(sum(d3[s] - t3[s] for s in (1, 2)) / 2, abs=1e-12)
    assert diff["naive_at"] == "micro-3" and "measured_gap" not in rows["transformer"]
    # skill = 1 - |error of the fit| / |error of the naive forecast|, against each forecast
    e = abs(diff["gap"] - g)
    assert diff["gap_skill"]["zero"] == pytest.approx(1 - e / abs(g), abs=1e-12)
    assert diff["gap_skill"]["largest"] == pytest.approx(1 - e / abs(diff["naive_gap"] - g), abs=1e-12)
    tok = {a: fit_power_law([r.tokens for r in runs if r.arch == a and "micro-4" not in r.model],
                            [r.final_val_loss for r in runs if r.arch == a and "micro-4" not in r.model])(BUDGETS[-1])
           for a in LAWS}  # fmt: skip
    assert diff["tokens_gap"] == pytest.approx(tok["diff"] - tok["transformer"], abs=1e-12)
    assert diff["gap_skill"]["tokens"] == pytest.approx(1 - e / abs(diff["tokens_gap"] - g), abs=1e-12)
    for w in rows.values():
        assert w["loss_skill"] == pytest.approx(
            1 - abs(w["loss"] - w["measured"]) / abs(w["tokens_loss"] - w["measured"]), abs=1e-12
        )
    md = render(result)
    assert "| diff | 2 | " in md and "skill vs zero / largest / tokens-only" in md


def test_add_runs_joins_a_later_sessions_runs_csv(tmp_path):
    """The prediction's runs in one runs.csv, the size trained later in another (its run folders gone): `add_runs`
    fits exactly as one table of both would; a run in both, or an add_runs path that is no sweep, is one line."""
    write_law_sweep(tmp_path / "s", LAWS, budgets=BUDGETS, sizes=(1, 2, 3, 4), noise=0.003)
    runs = collect(tmp_path / "s")
    first = [r for r in runs if not r.model.endswith("micro-4")]
    (tmp_path / "a.csv").write_text(to_csv(first, tmp_path))
    (tmp_path / "b.csv").write_text(to_csv([r for r in runs if r not in first], tmp_path))
    (tmp_path / "all.csv").write_text(to_csv(first + [r for r in runs if r not in first], tmp_path))
    cfg = ScalingConfig(reps=20, predict=f"micro-4@{BUDGETS[-1]}", holdout="micro-4")
    joined, _ = read_all(str(tmp_path / "a.csv"), [str(tmp_path / "b.csv")], [])
    whole, _ = read_all(str(tmp_path / "all.csv"), [], [])
    assert [r.run_dir for r in joined] == [r.run_dir for r in whole]
    a, b = fit_sweep(cfg, joined)["prediction"], fit_sweep(cfg, whole)["prediction"]
    assert a == b and all("measured" in w for w in a)
    with pytest.raises(UserError, match=r"add_runs: .*all.csv holds .*micro-1.*, which .*a.csv holds too"):
        read_all(str(tmp_path / "a.csv"), [str(tmp_path / "all.csv")], [])
    with pytest.raises(UserError, match=r"add_runs=.*b.txt: not a runs.csv"):
        (tmp_path / "b.txt").write_text("no,table\n1,2\n")
        read_all(str(tmp_path / "a.csv"), [str(tmp_path / "b.txt")], [])
