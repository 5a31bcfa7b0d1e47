"""The selection protocol (diffllm/scaling/protocol.py): split (choose on some seeds, report others), quadratic (the
tried value nearest the optimum of a quadratic in log lr over every seed) and same (best-of-grid on the reported
seeds), on run records whose losses the test chooses; the commands' one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diffllm.errors import UserError
from diffllm.results import RunRecord
from diffllm.scaling.protocol import quadratic_optimum, resolve
from diffllm.scaling.select import choices_markdown, paired_gaps, select_runs, selection_dict
from tests.distributed import cli_here

LRS = (0.001, 0.002, 0.004, 0.008)
# seed -> lr -> loss: seed 1's best lr is 0.002; seed 2's noisy minimum is 0.008; on the mean of both, 0.008 wins
LOSS = {
    1: {0.001: 3.30, 0.002: 3.20, 0.004: 3.25, 0.008: 3.28},
    2: {0.001: 3.32, 0.002: 3.24, 0.004: 3.23, 0.008: 3.10},
    3: {0.001: 3.31, 0.002: 3.22, 0.004: 3.21, 0.008: 3.26},
}


def record(arch: str, seed: int, lr: float, loss: float) -> RunRecord:
    return RunRecord(
        f"/s/{arch}/lr={lr}/seed{seed}", f"{arch}-micro-1", arch, seed, 10, 10, 10, 1000, 1.0, loss, loss, 1.0, 1,
        "finished", axes={"optim.lr": lr},
    )  # fmt: skip


def records(seeds=(1, 2, 3), arch="transformer", shift=0.0) -> list[RunRecord]:
    return [record(arch, s, lr, LOSS[s][lr] + shift) for s in seeds for lr in LRS]


def test_auto_splits_with_two_seeds_the_smallest_selects_the_others_report():
    sel = select_runs(records(), protocol="auto")
    (c,) = sel.choices
    assert (sel.protocol.mode, sel.protocol.select_seeds, sel.protocol.report_seeds) == ("split", (1,), (2, 3))
    assert c.value == 0.002 and c.means == pytest.approx(tuple(LOSS[1][lr] for lr in LRS))  # seed 1's values only
    assert sel.selected == {"/s/transformer/lr=0.002/seed2", "/s/transformer/lr=0.002/seed3"} and c.seeds == 2
    same = select_runs(records(), protocol="same")  # best-of-grid on the mean picks seed 2's noisy minimum
    assert same.choices[0].value == 0.008 and len(same.selected) == 3
    md = "\n".join(choices_markdown(selection_dict(sel)))
    assert "protocol split: chosen on seed(s) 1, reported on seed(s) 2, 3 only" in md
    assert select_runs(records(seeds=(1,)), protocol="auto").protocol.mode == "same"


def test_explicit_seeds_and_paired_gaps_use_the_reported_seeds_only():
    rs = records() + records(arch="diff", shift=-0.05)
    sel = select_runs(rs, protocol="auto", select_seeds=[3], report_seeds=[1, 2])
    assert [c.value for c in sel.choices] == [0.004, 0.004]  # seed 3's best, for both archs
    gaps, _ = paired_gaps(rs, sel, "transformer")
    assert gaps[0].seeds == (1, 2) and gaps[0].gaps == pytest.approx((-0.05, -0.05))


def test_quadratic_takes_the_tried_value_nearest_the_fitted_optimum():
    x, y = [], []
    for s in (1, 2, 3):
        for lr in LRS:
            x.append(lr)
            y.append(LOSS[s][lr])
    c, b, _ = np.polyfit(np.log(x), y, 2)  # the test's own fit
    optimum = math.exp(-b / (2 * c))
    assert quadratic_optimum(x, y, False) == pytest.approx(optimum, rel=1e-9)
    sel = select_runs(records(), protocol="quadratic")
    want = min(LRS, key=lambda lr: abs(math.log(lr / optimum)))
    assert sel.choices[0].value == want and sel.choices[0].optimum == pytest.approx(optimum)
    assert len(sel.selected) == 3  # every seed reported at it
    concave = [3.0, 3.3, 3.3, 3.0]  # curved the wrong way: no optimum, best of grid with a note
    flat = [record("transformer", 1, lr, v) for lr, v in zip(LRS, concave)]
    sel = select_runs(flat, protocol="quadratic")
    assert sel.choices[0].value == 0.001 and "no quadratic optimum" in sel.notes[0]


def test_protocol_errors_are_one_line():
    with pytest.raises(UserError, match=r"select_protocol=splt: expected one of .* \(did you mean split\?\)"):
        resolve("splt", [1, 2])
    with pytest.raises(UserError, match="select_seeds and report_seeds share seed 2"):
        resolve("auto", [1, 2], [1, 2], [2])
    with pytest.raises(UserError, match="select_protocol=split: needs a seed to select on and one to report"):
        resolve("split", [1])
    with pytest.raises(UserError, match="select_protocol=same: select_seeds/report_seeds go with"):
        resolve("same", [1, 2], [1])


def test_scaling_fit_cli_rejects_an_unknown_protocol_in_one_line(tmp_path):
    done = cli_here("scaling", "fit", f"sweep_dir={tmp_path}", "select_protocol=splt")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "diffllm scaling fit: error: select_protocol=splt: expected one of auto, split, quadratic, same "
        "(did you mean split?)"
    )


def test_bootstrap_redraws_runs_per_size_from_the_series_generator():
    """L(N)'s replicates are fits to the runs redrawn size by size (every size keeps its count; only measured losses
    appear), drawn from the generator of (config seed, series name)."""
    from diffllm.scaling.fit import bootstrap_power_law, fit_power_law
    from diffllm.scaling.resample import generator, strata, take, uniforms

    x = np.repeat([1e5, 2e5, 4e5, 8e5], 3)
    seeds = [1, 2, 3] * 4
    y = 2.0 + 30 * x**-0.3 + np.tile([0.01, -0.02, 0.015], 4)
    _, boot = bootstrap_power_law(x, y, 5, generator(0, "transformer"), seeds)
    rng, groups = generator(0, "transformer"), strata(x, seeds)
    for b in boot:
        i = take(groups, uniforms(rng, [groups]))
        assert sorted(x[i]) == sorted(x) and set(y[i]) <= set(y)
        assert b == fit_power_law(x[i], y[i])
    other = bootstrap_power_law(x, y, 5, generator(0, "diff"), seeds)[1]
    assert other != boot  # another series' name: another generator


def test_a_series_interval_does_not_change_when_another_series_is_added(tmp_path):
    from diffllm.results import collect
    from diffllm.scaling.fit import JointLaw
    from diffllm.scaling.report import ScalingConfig, fit_sweep
    from tests.scaling.synthetic import write_law_sweep

    t, d = JointLaw(1.5, 60.0, 0.35, 900.0, 0.4), JointLaw(1.5, 50.0, 0.35, 900.0, 0.4)
    seeds = lambda size: (1, 2, 3)  # noqa: E731
    write_law_sweep(tmp_path / "one", {"transformer": t}, seeds=seeds, noise=0.01, sizes=(1, 2, 3))
    write_law_sweep(tmp_path / "two", {"transformer": t, "diff": d}, seeds=seeds, noise=0.01, sizes=(1, 2, 3))
    fits = {}
    for name in ("one", "two"):
        cfg = ScalingConfig(sweep_dir=str(tmp_path / name), reps=30, joint="none")
        fits[name] = {f.arch: f for f in fit_sweep(cfg, collect(cfg.sweep_dir))["power_law"]}
    assert fits["one"]["transformer"] == fits["two"]["transformer"]  # same data, same interval
    assert fits["two"]["diff"].alpha != fits["two"]["transformer"].alpha
