"""Learning-rate transfer (issue 32 §2): the fitted optimum against the closed-form minimum of the quadratic that made
the losses, the shift per doubling and the loss lost against direct float64 arithmetic, `study transfer` from its
command line, and `diffllm sweep lr_from=` from the real command line (the lrs it plans, and its one-line refusals)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from diffllm.errors import UserError
from diffllm.results import RunRecord, to_csv
from diffllm.scaling.transfer import Point, curves, fit_optimum, tuned_lrs
from diffllm.studies import transfer
from diffllm.studies.common import read_records
from diffllm.sweep.cli import with_lr_from
from diffllm.sweep.grid import SweepConfig
from tests.distributed import cli_here

REPO = Path(__file__).resolve().parents[2]
WIDTHS, LRS, SEEDS = (16, 32, 64, 128), (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2), (1, 2)
CENTRE, CURVE = math.log2(1e-2), 0.05  # sp's optimum at d=16 (log2 lr), the quadratic's curvature
SHIFT = {"sp": -0.7, "mup": 0.0}  # log2 lr* per doubling of width
SEED_OFFSET = {1: -0.01, 2: +0.01}  # a constant per seed: moves no optimum


def loss(arch: str, param: str, width: int, lr: float, seed: int) -> float:
    best = CENTRE + SHIFT[param] * math.log2(width / 16) + (0.3 if arch == "diff" else 0.0)
    return 4.0 - 0.1 * math.log2(width) + CURVE * (math.log2(lr) - best) ** 2 + SEED_OFFSET[seed]


def record(arch: str, param: str, width: int, lr: float, seed: int, root: Path) -> RunRecord:
    model = f"{arch}-micro-1"
    run_dir = root / model / f"d_model={width},parametrization={param},lr={lr!r}" / f"seed{seed}"
    value = loss(arch, param, width, lr, seed)
    return RunRecord(
        str(run_dir), model, arch, seed, None, None, None, 307200, None, value, value, 1.0, 1, "finished",
        axes={"model.d_model": width, "model.parametrization": param, "optim.lr": lr},
    )  # fmt: skip


@pytest.fixture
def runs_csv(tmp_path) -> Path:
    records = [
        record(a, p, w, lr, s, tmp_path)
        for a in ("transformer", "diff")
        for p in ("sp", "mup")
        for w in WIDTHS
        for lr in LRS
        for s in SEEDS
    ]
    path = tmp_path / "runs.csv"
    path.write_text(to_csv(records, tmp_path))
    return path


def test_fit_optimum_is_the_quadratics_minimum():
    pts = [Point(lr, s, loss("transformer", "sp", 64, lr, s)) for lr in LRS for s in SEEDS]
    opt = fit_optimum(pts)
    assert opt.log2_lr == pytest.approx(CENTRE - 1.4, abs=1e-9) and opt.inside
    assert opt.loss_at(opt.log2_lr) == pytest.approx(4.0 - 0.6, abs=1e-9)  # the seed offsets average out
    down = [Point(p.lr, p.seed, -p.loss) for p in pts]  # curved the wrong way: no optimum
    assert fit_optimum(down) is None
    assert fit_optimum(pts[:4]) is None  # two lr values


def test_an_optimum_beyond_the_grid_is_marked_extrapolated():
    pts = [Point(lr, 1, (math.log2(lr) - math.log2(0.1)) ** 2) for lr in LRS]
    opt = fit_optimum(pts)
    assert not opt.inside and opt.lr == pytest.approx(0.1, rel=1e-9)


def test_study_recovers_the_shift_and_the_loss_lost(runs_csv, tmp_path):
    text = transfer.run(transfer.Config(sweep_dir=str(runs_csv), out=str(tmp_path / "out"), resamples=50))
    rows = {(s.name, s.parametrization): s for s in _results(runs_csv)}
    for arch in ("transformer", "diff"):
        for param, shift in SHIFT.items():
            s = rows[(arch, param)]
            assert s.shift == pytest.approx(shift, abs=1e-9)
            assert s.shift_ci == pytest.approx((shift, shift), abs=1e-9)  # every seed resample: the same optima
            # d=128 trained at d=16's lr*: 3 doublings x the shift away from its own, on a quadratic of curvature CURVE
            assert s.lost_fit == pytest.approx(CURVE * (3 * shift) ** 2, abs=1e-9)
    assert "| transformer | sp |" in text and "+0.00 [+0.00, +0.00]" in text
    assert (tmp_path / "out" / "transfer.png").stat().st_size > 10_000
    assert "d=16: 0 (20)" in text  # sp and mup share every other axis here; at d=16 the synthetic losses agree


def _results(runs_csv):
    groups: dict = {}
    for (name, param, width), pts in curves(read_records(str(runs_csv), "sweep_dir")).items():
        groups.setdefault((name, param), {})[width] = pts
    return [transfer.analyse(n, p, bw, np.random.default_rng(0), 20) for (n, p), bw in groups.items()]


def test_study_transfer_command_line(runs_csv, tmp_path):
    out = cli_here("study", "transfer", f"sweep_dir={runs_csv}", f"out={tmp_path / 'o'}", "resamples=20")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o" / "transfer.md").read_text() in out.stdout
    one = cli_here("study", "transfer", f"sweep_dir={runs_csv}", f"out={tmp_path / 'one'}", "resamples=5", "seeds=[2]")
    assert one.returncode == 0 and "Seeds [2]; " in one.stdout, one.stderr
    missing = cli_here("study", "transfer", f"sweep_dir={tmp_path / 'nope'}")
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
    assert "does not exist" in missing.stderr


def test_tuned_lrs_is_each_archs_optimum_at_the_base_width(runs_csv):
    tuned = tuned_lrs(str(runs_csv), 16)
    assert tuned["transformer"] == (float(f"{2**CENTRE:.3g}"), 20)  # sp and mup runs: one model at the base width
    assert tuned["diff"][0] == float(f"{2 ** (CENTRE + 0.3):.3g}")
    with pytest.raises(UserError, match="no runs at the base width d_model 24"):
        tuned_lrs(str(runs_csv), 24)
    with pytest.raises(UserError, match="does not exist"):
        tuned_lrs(str(runs_csv).replace("runs.csv", "missing.csv"), 16)


GRID = {
    "name": "sized",
    "models": ["transformer-micro-1", "diff-micro-2"],
    "tokens": [4096],
    "seeds": [1],
    "overrides": ["model.parametrization=mup", "model.base_width=16"],
}


def sweep(tmp_path: Path, grid: dict, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "configs" / "sweep").mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs" / "sweep" / "sized.yaml").write_text(yaml.safe_dump(grid))
    argv = ["--config-dir", str(tmp_path / "configs"), "sweep=sized", f"sweep_dir={tmp_path / 's'}", "dry_run=true"]
    return cli_here("sweep", *argv, *args)


def test_sweep_lr_from_plans_each_arch_at_its_tuned_lr(runs_csv, tmp_path):
    out = sweep(tmp_path, GRID, f"lr_from={runs_csv}")
    assert out.returncode == 0, out.stderr
    t, d = (float(f"{2**x:.3g}") for x in (CENTRE, CENTRE + 0.3))
    assert f"lr_from={runs_csv}: diff {d:g} (20 runs at d_model 16), transformer {t:g} (20 runs at d_model 16)" in (
        out.stdout
    )
    commands = [line for line in out.stdout.splitlines() if "--multirun" in line]
    assert len(commands) == 2
    assert any("model=transformer-micro-1 " in c and f"optim.lr={t!r}" in c for c in commands)
    assert any("model=diff-micro-2 " in c and f"optim.lr={d!r}" in c for c in commands)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"grid": {"optim.lr": [1e-3]}}, "also sets optim.lr"),
        ({"overrides": ["model.base_width=16"]}, "transfers across width under mup only"),
        ({"models": ["mla-micro-1"]}, "no mla runs to tune mla-micro-1 on"),
    ],
)
def test_sweep_lr_from_refusals_name_the_culprit(runs_csv, change, message):
    with pytest.raises(UserError, match=message):
        with_lr_from(SweepConfig(**{**GRID, **change}), str(runs_csv))


def test_lr_from_seeds_fits_on_those_tuning_seeds_only(tmp_path):
    """Seed 2's optimum lies 1 log2 step above seed 1's: `lr_from_seeds=[1]` plans seed 1's optimum exactly (a
    prediction's lr does not move when the tuning sweep gains seeds), every seed lands between, a missing seed is
    refused in one line."""
    records = [record("transformer", "mup", 16, lr, 1, tmp_path) for lr in LRS]
    for lr in LRS:
        moved = record("transformer", "mup", 16, lr, 2, tmp_path)
        moved.final_val_loss = loss("transformer", "mup", 16, lr / 2, 2)  # the curve of seed 1, one doubling up
        records.append(moved)
    path = tmp_path / "runs.csv"
    path.write_text(to_csv(records, tmp_path))
    one, two, both = (tuned_lrs(str(path), 16, s)["transformer"] for s in ([1], [2], None))
    assert one == (float(f"{2**CENTRE:.3g}"), 5) and two == (float(f"{2 ** (CENTRE + 1):.3g}"), 5)
    assert one[0] < both[0] < two[0] and both[1] == 10
    with pytest.raises(UserError, match=r"lr_from_seeds=\[3\]: .* has no runs of seed 3"):
        tuned_lrs(str(path), 16, [3])
    out = sweep(tmp_path, {**GRID, "models": ["transformer-micro-1"]}, f"lr_from={path}", "lr_from_seeds=[2]")
    assert out.returncode == 0, out.stderr
    assert f"optim.lr={two[0]!r}" in out.stdout
