"""The figures of `scaling fit`, read back from their matplotlib artists (titles, caveat text, the points and lines
drawn), not from pixels: a title names a fit only where one was made; every point is the loss the tables use (each
run's final value on the whole held-out set, at its own budget), not in-loop validation; a degenerate L(N, D) (a
coefficient at its bound) draws no compute-optimal frontier; and fits.md's caveats are printed on the figure."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.markers import MarkerStyle

from diffllm.results import collect
from diffllm.scaling.fit import JointLaw
from diffllm.scaling.plots import figures
from diffllm.scaling.report import ScalingConfig, fit_sweep
from tests.scaling.synthetic import DOC_LAWS, write_law_sweep

LAWS = {a: JointLaw(*p) for a, p in DOC_LAWS.items()}
WHOLE_SET = -0.03  # the final loss on the whole held-out set, against the last in-loop (subset) value


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _points(ax) -> set[tuple[float, float]]:
    return {(float(x), round(float(y), 9)) for c in ax.collections for x, y in c.get_offsets()}


def _caveats(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts if t.get_text().startswith("caveats"))


def _whole_set_finals(root: Path) -> None:
    """summary.json's final_val_loss is the whole held-out set's, which differs from the last in-loop value."""
    for summary in root.rglob("summary.json"):
        s = json.loads(summary.read_text())
        s["final_val_loss"] += WHOLE_SET
        summary.write_text(json.dumps(s))


def test_no_fit_is_not_titled_as_one_and_the_reason_is_on_the_figure(tmp_path):
    """Two sizes: no L(N) is fitted; loss_vs_params.png was still titled "L(N)" (issue 56)."""
    write_law_sweep(tmp_path / "s", LAWS, sizes=(1, 2), seeds=lambda size: (1, 2), noise=0.002)
    cfg = ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, joint="none", title="t")
    figs = figures(fit_sweep(cfg, collect(cfg.sweep_dir))["_plot"])
    ax = figs["loss_vs_params.png"].axes[0]
    assert ax.get_title() == "t: final loss vs N (no L(N) fit: see fits.md) at D = 524,288 tokens"
    assert len(ax.lines) == 0 and len(_points(ax)) == 8
    caveats = _caveats(figs["loss_vs_params.png"])
    assert "- no L(N) fit for Transformer: refused: 4 points at 2 sizes; L(N) needs >= 4 points at >= 3" in caveats
    assert figs["loss_vs_tokens.png"].axes[0].get_title() == "t: final loss vs tokens (no L(N, D) fit)"
    assert "- joint=none: no L(N, D) fit" in _caveats(figs["loss_vs_tokens.png"])


def test_points_are_each_runs_final_loss_on_the_whole_set_at_its_own_budget(tmp_path):
    """WSD-style budgets (the largest run's in-loop curve passes the smaller budget mid-run): loss_vs_tokens.png drew
    the largest run's in-loop (subset) curve, so at the smaller budget the stable run's mid-run value stood where the
    tables have the cooldown's final, whole-set loss (issue 56). Now every point is a run's final loss at its budget,
    as the tables and the L(N, D) fit (joint=final) have them; under-trained runs are open markers, said in the
    caveats; and L(N) at the L(N) budget is titled and drawn."""
    write_law_sweep(tmp_path / "s", LAWS, budgets=(524288, 1048576), seeds=lambda size: (1, 2), noise=0.002)
    _whole_set_finals(tmp_path / "s")
    runs = collect(str(tmp_path / "s"))
    weak = next(r for r in runs if r.arch == "diff" and r.model.endswith("micro-1") and r.tokens == 524288)
    weak.under_trained = True
    result = fit_sweep(ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, title="t"), runs)
    assert result["joint_mode"] == "final"
    figs = figures(result["_plot"])
    ax = figs["loss_vs_tokens.png"].axes[0]
    finals = {(float(r.tokens), round(r.final_val_loss, 9)) for r in runs}
    assert _points(ax) == finals and len(finals) == 32
    in_loop = {(t, round(v, 9)) for r in runs for t, v in zip(*_curve(r.run_dir))}
    assert not _points(ax) & in_loop
    assert ax.get_title() == "t: final loss vs tokens, L(N, D) fit (final points)"
    assert ax.get_ylabel() == "final validation loss (whole held-out set)"
    assert len(ax.lines) == 8  # L(N, D) at each (series, N)
    law, n = result["_plot"].joint["diff"], result["_plot"].n_of(weak)
    line = next(ln for ln in ax.lines if np.allclose(ln.get_ydata(), law(n, ln.get_xdata())))
    assert line.get_xdata().min() == 524288 and line.get_xdata().max() == 1048576
    open_ = [c for c in ax.collections if len(c.get_facecolors()) == 0]
    assert [tuple(map(float, c.get_offsets()[0])) for c in open_] == [(524288.0, weak.final_val_loss)]
    assert "- 1 of 32 runs under-trained (final loss >= bigram baseline): open markers, fitted" in _caveats(
        figs["loss_vs_tokens.png"]
    )
    params = figs["loss_vs_params.png"].axes[0]
    assert params.get_title() == "t: L(N) at D = 1,048,576 tokens" and len(params.lines) == 2
    assert _points(params) == {(float(r.block_params), round(r.final_val_loss, 9)) for r in runs if r.tokens == 1048576}
    assert _caveats(figs["loss_vs_params.png"]) == ""  # the under-trained run is not at the L(N) budget


def test_a_degenerate_fit_draws_no_frontier_and_says_so(tmp_path):
    """Diff's losses fall as its size shrinks (A < 0): its L(N, D) can only put A at its bound 0, and its frontier
    ran along the search range's edge, below every run (issue 56). It is not drawn; the caveat says why; the
    Transformer's frontier is drawn."""
    laws = {"transformer": LAWS["transformer"], "diff": JointLaw(1.5, -5.0, 0.35, 900.0, 0.4)}
    write_law_sweep(tmp_path / "s", laws, budgets=(524288, 1048576, 2097152), noise=0.001)
    result = fit_sweep(ScalingConfig(sweep_dir=str(tmp_path / "s"), reps=20, title="t"), collect(str(tmp_path / "s")))
    assert "A=0" in result["joint"]["diff"]["flags"] and not result["joint"]["transformer"]["flags"]
    figs = figures(result["_plot"])
    ax = figs["loss_vs_compute.png"].axes[0]
    assert ax.get_title() == "t: compute-optimal frontier"
    assert [ln.get_label() for ln in ax.lines] == ["Transformer: frontier L*(C)"]
    caveats = _caveats(figs["loss_vs_compute.png"])
    assert "- L(N, D) for Diff Transformer at a bound (A=0" in caveats
    assert "a degenerate fit, no frontier drawn" in caveats
    assert "a degenerate fit, no frontier drawn" in _caveats(figs["iso_flop.png"])
    transformer, diff = figs["iso_flop.png"].axes
    assert diff.get_title() == "Diff Transformer"
    star = MarkerStyle("*").get_path().transformed(MarkerStyle("*").get_transform()).vertices
    stars = {
        ax.get_title(): sum(
            c.get_paths()[0].vertices.shape == star.shape and np.allclose(c.get_paths()[0].vertices, star)
            for c in ax.collections
            if c.get_paths()
        )
        for ax in (transformer, diff)
    }
    assert stars == {"Transformer": 4, "Diff Transformer": 0}  # an optimum per iso-FLOP curve, none when degenerate


def _curve(run_dir: str):
    from diffllm.scaling.inputs import val_curve

    return val_curve(run_dir)
