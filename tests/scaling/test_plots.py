"""The figures of `scaling fit`, read back from their matplotlib artists (titles, caveat text, the points and lines
drawn), not from pixels: a title names a fit only where one was made; every point is the loss the tables use (each
run's final value on the whole held-out set, at its own budget), not in-loop validation; a degenerate L(N, D) (a
coefficient at its bound) draws no compute-optimal frontier; and fits.md's caveats are printed on the figure."""

from __future__ import annotations

import dataclasses
import json

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.markers import MarkerStyle

from diffllm.results import collect
from diffllm.scaling.fit import JointLaw
from diffllm.scaling.inputs import val_curve
from diffllm.scaling.plots import iso_flop_curves, loss_vs_compute, loss_vs_params, loss_vs_tokens
from diffllm.scaling.report import ScalingConfig, fit_sweep
from tests.scaling.synthetic import DOC_LAWS, write_law_sweep

# Diff's and the Transformer's laws of docs/scaling.md; V2's losses fall as its size shrinks (A < 0), which L(N, D) can
# only fit with A at its bound 0: a degenerate fit
LAWS = {a: JointLaw(*p) for a, p in DOC_LAWS.items()} | {"diff2": JointLaw(1.5, -5.0, 0.35, 900.0, 0.4)}
WHOLE_SET = -0.03  # the final loss on the whole held-out set, against the last in-loop (subset) value


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Every run of the three laws at 4 sizes x 2 budgets x 2 seeds; summary.json's final loss is the whole held-out
    set's, which differs from the last in-loop value in metrics.jsonl."""
    root = tmp_path_factory.mktemp("plots") / "s"
    write_law_sweep(root, LAWS, budgets=(524288, 1048576), seeds=lambda size: (1, 2), noise=0.002)
    for summary in root.rglob("summary.json"):
        s = json.loads(summary.read_text())
        s["final_val_loss"] += WHOLE_SET
        summary.write_text(json.dumps(s))
    return str(root), collect(str(root))


def _of(runs, archs, sizes=(1, 2, 3, 4)):
    return [r for r in runs if r.arch in archs and int(r.model.rsplit("-", 1)[1]) in sizes]


def _points(ax) -> set[tuple[float, float]]:
    return {(float(x), round(float(y), 9)) for c in ax.collections for x, y in c.get_offsets()}


def _caveats(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts if t.get_text().startswith("caveats"))


def test_no_fit_is_not_titled_as_one_and_the_reason_is_on_the_figure(sweep):
    """Two sizes: no L(N) is fitted; loss_vs_params.png was still titled "L(N)" (issue 56)."""
    root, runs = sweep
    cfg = ScalingConfig(sweep_dir=root, reps=20, joint="none", title="t", tokens=524288)
    d = fit_sweep(cfg, _of(runs, ("transformer", "diff"), sizes=(1, 2)))["_plot"]
    fig = loss_vs_params(d)
    ax = fig.axes[0]
    assert ax.get_title() == "t: final loss vs N (no L(N) fit: see fits.md) at D = 524,288 tokens"
    assert len(ax.lines) == 0 and len(_points(ax)) == 8
    assert "- no L(N) fit for Transformer: refused: 4 points at 2 sizes; L(N) needs >= 4 points at >= 3" in _caveats(
        fig
    )
    fig = loss_vs_tokens(d)
    assert fig.axes[0].get_title() == "t: final loss vs tokens (no L(N, D) fit)"
    assert "- joint=none: no L(N, D) fit" in _caveats(fig)


def test_points_are_each_runs_final_loss_on_the_whole_set_at_its_own_budget(sweep):
    """WSD-style budgets (the largest run's in-loop curve passes the smaller budget mid-run): loss_vs_tokens.png drew
    the largest run's in-loop (subset) curve, so at the smaller budget the stable run's mid-run value stood where the
    tables have the cooldown's final, whole-set loss (issue 56). Now every point is a run's final loss at its budget,
    as the tables and the L(N, D) fit (joint=final) have them; under-trained runs are open markers, said in the
    caveats; and L(N) at the L(N) budget is titled and drawn."""
    root, runs = sweep
    runs = [dataclasses.replace(r) for r in _of(runs, ("transformer", "diff"))]
    weak = next(r for r in runs if r.arch == "diff" and r.model.endswith("micro-1") and r.tokens == 524288)
    weak.under_trained = True
    result = fit_sweep(ScalingConfig(sweep_dir=root, reps=20, title="t"), runs)
    assert result["joint_mode"] == "final"
    d = result["_plot"]
    fig = loss_vs_tokens(d)
    ax = fig.axes[0]
    finals = {(float(r.tokens), round(r.final_val_loss, 9)) for r in runs}
    assert _points(ax) == finals and len(finals) == 32
    in_loop = {(t, round(v, 9)) for r in runs for t, v in zip(*val_curve(r.run_dir))}
    assert not _points(ax) & in_loop
    assert ax.get_title() == "t: final loss vs tokens, L(N, D) fit (final points)"
    assert ax.get_ylabel() == "final validation loss (whole held-out set)"
    assert len(ax.lines) == 8  # L(N, D) at each (series, N)
    law, n = d.joint["diff"], d.n_of(weak)
    line = next(ln for ln in ax.lines if np.allclose(ln.get_ydata(), law(n, ln.get_xdata())))
    assert line.get_xdata().min() == 524288 and line.get_xdata().max() == 1048576
    open_ = [c for c in ax.collections if len(c.get_facecolors()) == 0]
    assert [tuple(map(float, c.get_offsets()[0])) for c in open_] == [(524288.0, weak.final_val_loss)]
    assert "- 1 of 32 runs under-trained (final loss >= bigram baseline): open markers, fitted" in _caveats(fig)
    fig = loss_vs_params(d)
    params = fig.axes[0]
    assert params.get_title() == "t: L(N) at D = 1,048,576 tokens" and len(params.lines) == 2
    assert _points(params) == {(float(r.block_params), round(r.final_val_loss, 9)) for r in runs if r.tokens == 1048576}
    assert _caveats(fig) == ""  # the under-trained run is not at the L(N) budget


def test_a_degenerate_fit_draws_no_frontier_and_says_so(sweep):
    """V2's losses fall as its size shrinks (A < 0): its L(N, D) can only put A at its bound 0, and its frontier ran
    along the search range's edge, below every run (issue 56). It is not drawn; the caveat says why; the
    Transformer's frontier is drawn."""
    root, runs = sweep
    result = fit_sweep(ScalingConfig(sweep_dir=root, reps=20, title="t"), _of(runs, ("transformer", "diff2")))
    assert "A=0" in result["joint"]["diff2"]["flags"] and not result["joint"]["transformer"]["flags"]
    d = result["_plot"]
    fig = loss_vs_compute(d)
    ax = fig.axes[0]
    assert ax.get_title() == "t: compute-optimal frontier"
    assert [ln.get_label() for ln in ax.lines] == ["Transformer: frontier L*(C)"]
    assert "- L(N, D) for Diff Transformer V2 at a bound (A=0" in _caveats(fig)
    assert "a degenerate fit, no frontier drawn" in _caveats(fig)
    fig = iso_flop_curves(d)
    assert "a degenerate fit, no frontier drawn" in _caveats(fig)
    star = MarkerStyle("*").get_path().transformed(MarkerStyle("*").get_transform()).vertices
    stars = {
        ax.get_title(): sum(
            c.get_paths()[0].vertices.shape == star.shape and np.allclose(c.get_paths()[0].vertices, star)
            for c in ax.collections
            if c.get_paths()
        )
        for ax in fig.axes
    }
    assert stars == {"Transformer": 4, "Diff Transformer V2": 0}  # an optimum per iso-FLOP curve, none when degenerate
