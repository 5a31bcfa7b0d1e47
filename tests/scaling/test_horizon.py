"""Transfer across the token horizon (issue 55 §2): the law lr*(D) = B·D^-β recovered from synthetic optima with a known
β (exactly without noise; a 90% interval that covers it about 90% of the time with seed noise), its refusals, the
timescale rule against direct arithmetic, `study transfer`'s horizon table, and `diffllm sweep lr_from=` from the real
command line giving each run its own lr and weight decay from its budget."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from diffllm.errors import UserError
from diffllm.model.presets import load_preset
from diffllm.results import RunRecord, collect, to_csv
from diffllm.scaling.horizon import fit_law, timescale_weight_decay
from diffllm.scaling.transfer import Point, width_of
from diffllm.studies import transfer
from diffllm.sweep.cli import with_lr_from
from diffllm.sweep.grid import SweepConfig, plan_runs

REPO = Path(__file__).resolve().parents[2]
BUDGETS = (786432, 3145728, 12582912)  # 512, 2048 and 8192 steps of 1,536 tokens: 16x
LRS = tuple(2.0**k for k in range(-10, -2))
BETA = {"transformer": 0.3, "diff": 0.5}
LOG2_B = {a: -6.0 + beta * math.log2(BUDGETS[0]) for a, beta in BETA.items()}  # lr* = 2^-6 at the smallest budget


def best(arch: str, tokens: int) -> float:
    return LOG2_B[arch] - BETA[arch] * math.log2(tokens)


def points(arch: str, budgets, seeds, shift_sd: float, rng) -> dict[int, list[Point]]:
    """Quadratics in log2 lr around lr*(D), each (budget, seed) with its own optimum N(0, shift_sd) log2 away."""
    out = {}
    for t in budgets:
        shifts = {s: rng.normal(0.0, shift_sd) if shift_sd else 0.0 for s in seeds}
        loss = lambda lr, s: 3.0 + 0.05 * (math.log2(lr) - best(arch, t) - shifts[s]) ** 2  # noqa: E731, B023
        out[t] = [Point(lr, s, loss(lr, s)) for lr in LRS for s in seeds]
    return out


def test_the_law_is_recovered_exactly_without_noise():
    rng = np.random.default_rng(0)
    for arch, beta in BETA.items():
        law = fit_law(arch, 16, points(arch, BUDGETS, (1, 2), 0.0, rng), rng, 20)
        assert law.beta == pytest.approx(beta, abs=1e-9) and law.log2_b == pytest.approx(LOG2_B[arch], abs=1e-9)
        assert law.beta_ci == pytest.approx((beta, beta), abs=1e-9)  # every seed resample: the same optima
        target = 8 * BUDGETS[-1]  # extrapolated 8x beyond the largest budget
        assert law.lr_at(target) == pytest.approx(2 ** best(arch, target), rel=1e-9)


def test_the_interval_covers_beta_about_90_percent_of_the_time():
    """6 seeds, each optimum moved N(0, 0.3) in log2 per (budget, seed): the seed-resampled 90% interval covers the
    true β in 0.75-0.98 of 40 draws (a percentile bootstrap over 6 seeds runs a little short of 90%)."""
    rng = np.random.default_rng(1)
    laws = [fit_law("t", 16, points("transformer", BUDGETS, range(1, 7), 0.3, rng), rng, 100) for _ in range(40)]
    covered = sum(law.beta_ci[0] <= BETA["transformer"] <= law.beta_ci[1] for law in laws) / len(laws)
    assert 0.75 <= covered <= 0.98
    assert all(law.beta_ci[1] > law.beta_ci[0] for law in laws)  # noise gives every interval a width


@pytest.mark.parametrize(
    "budgets, lrs, message",
    [
        (BUDGETS[:2], LRS, "has 2 token budgets .* needs >= 3"),
        ((786432, 1572864, 3145728), LRS, "span 4x; a horizon law needs >= 16x"),
        (BUDGETS, LRS[:4], "at 786432 tokens has no optimum inside its lr grid"),
    ],
)
def test_a_law_without_enough_horizons_or_an_edge_optimum_is_refused(budgets, lrs, message):
    rng = np.random.default_rng(0)
    by = {t: [p for p in pts if p.lr in lrs] for t, pts in points("transformer", budgets, (1,), 0.0, rng).items()}
    with pytest.raises(UserError, match=message):
        fit_law("transformer", 16, by, rng, 0)


def test_timescale_weight_decay_holds_the_fraction():
    wd = timescale_weight_decay(0.01, 0.5, 2048)
    assert wd == pytest.approx(1 / (0.01 * 0.5 * 2048), rel=1e-15)
    assert (1 / (0.01 * wd)) / 2048 == pytest.approx(0.5, rel=1e-12)  # tau_iter / steps


def record(arch: str, tokens: int, lr: float, seed: int, root: Path) -> RunRecord:
    model = f"{arch}-micro-1"
    run_dir = root / model / str(tokens) / f"d_model=16,lr={lr!r}" / f"seed{seed}"
    loss = 3.0 + 0.05 * (math.log2(lr) - best(arch, tokens)) ** 2 + 0.01 * seed
    return RunRecord(
        str(run_dir), model, arch, seed, None, None, None, tokens, None, loss, loss, 1.0, 1, "finished",
        axes={"model.d_model": 16, "optim.lr": lr},
    )  # fmt: skip


def test_collect_keeps_a_grid_width_that_never_varies(tmp_path):
    """A tuning grid trains every run at one `model.d_model` (the base width) that is not its preset's: collect keeps it
    as an axis though it never varies, so `lr_from` and `study transfer` see the width the runs trained at (without
    it, every run read as its preset's d_model 32 and lr_from found no runs at the base width)."""
    for arch, lr in (("transformer", 0.01), ("transformer", 0.02), ("diff", 0.01)):
        run = tmp_path / "runs" / f"{arch}-l4-d32" / "98304" / f"d_model=16,lr={lr}" / "seed1"
        run.mkdir(parents=True)
        model = {**dataclasses.asdict(load_preset(f"{arch}-l4-d32")), "d_model": 16}
        (run / "config.yaml").write_text(yaml.safe_dump({"model": model, "optim": {"lr": lr}, "seed": 1}))
        summary = {
            "model": f"{arch}-l4-d32",
            "arch": arch,
            "tokens": 98304,
            "final_val_loss": 5.0,
            "status": "finished",
        }
        (run / "summary.json").write_text(json.dumps(summary))
    records = collect(tmp_path / "runs")
    assert {(r.arch, r.axes["model.d_model"], width_of(r)) for r in records} == {
        ("transformer", 16, 16),
        ("diff", 16, 16),
    }


@pytest.fixture
def tuning_csv(tmp_path) -> Path:
    records = [record(a, t, lr, s, tmp_path) for a in BETA for t in BUDGETS for lr in LRS for s in (1, 2)]
    path = tmp_path / "runs.csv"
    path.write_text(to_csv(records, tmp_path))
    return path


def test_study_transfer_reports_the_horizon_exponent_per_arch(tuning_csv, tmp_path):
    text = transfer.run(transfer.Config(sweep_dir=str(tuning_csv), out=str(tmp_path / "o"), resamples=20))
    assert "across the token horizon" in text and "across width" not in text
    for arch, beta in BETA.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {arch} | 16 |"))
        assert f"| {beta:.3f} [{beta:.3f}, {beta:.3f}] |" in row
    assert (tmp_path / "o" / "horizon.json").exists()


GRID = {
    "name": "ladder",
    "models": ["transformer-micro-1", "diff-micro-2"],
    "tokens": [1572864, 25165824],
    "seeds": [1],
    "tau_fraction": 0.5,
    "overrides": ["model.parametrization=mup", "model.base_width=16"]
    + ["trainer.global_batch_tokens=1536", "trainer.micro_batch_size=6"],
}


def sweep(tmp_path: Path, grid: dict, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "configs" / "sweep").mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs" / "sweep" / "ladder.yaml").write_text(yaml.safe_dump(grid))
    argv = ["--config-dir", str(tmp_path / "configs"), "sweep=ladder", f"sweep_dir={tmp_path / 's'}", "dry_run=true"]
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "sweep", *argv, *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_sweep_lr_from_gives_each_run_its_lr_and_weight_decay_from_its_budget(tuning_csv, tmp_path):
    out = sweep(tmp_path, GRID, f"lr_from={tuning_csv}")
    assert out.returncode == 0, out.stderr
    assert re.search(r"transformer lr\*\(D\) = [0-9.]+·D\^-0\.300 \[90%: 0\.300, 0\.300\] \(48 runs", out.stdout)
    commands = [line for line in out.stdout.splitlines() if "--multirun" in line]
    assert len(commands) == 4  # one per (model, budget): each has its own lr and weight decay
    for arch, model in (("transformer", "transformer-micro-1"), ("diff", "diff-micro-2")):
        for tokens in GRID["tokens"]:
            lr = float(f"{2 ** best(arch, tokens):.3g}")
            wd = float(f"{1 / (lr * 0.5 * (tokens // 1536)):.3g}")
            assert any(
                f"model={model} " in c and f"trainer.tokens={tokens} " in c and f"optim.lr={lr!r} " in c
                and f"optim.weight_decay={wd!r}" in c
                for c in commands
            ), (arch, tokens, lr, wd)  # fmt: skip


def test_tau_fraction_sets_weight_decay_on_a_plain_lr_grid(tmp_path):
    grid = SweepConfig(**{**GRID, "grid": {"optim.lr": [0.01, 0.02]}, "models": ["transformer-micro-1"]})
    runs = plan_runs(grid, tmp_path)
    got = {(r.tokens, dict(r.axes)["optim.lr"]): dict(r.axes)["optim.weight_decay"] for r in runs}
    assert got == {(t, lr): float(f"{1 / (lr * 0.5 * (t // 1536)):.3g}") for t in GRID["tokens"] for lr in (0.01, 0.02)}
    assert "lr=0.01,weight_decay=" in str(runs[0].run_dir)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"budget_mode": "branch", "overrides": GRID["overrides"] + ["optim.schedule=wsd"]}, "budget_mode=scratch"),
        ({"overrides": GRID["overrides"] + ["optim.weight_decay=0.1"]}, "sets optim.weight_decay per run"),
        ({"overrides": GRID["overrides"][:2] + ["optim.lr=0.01"]}, "needs trainer.global_batch_tokens"),
        ({}, "no optim.lr for transformer-micro-1"),
        ({"tau_fraction": 0.0, "grid": {"optim.lr": [0.01]}}, "must be > 0"),
    ],
)
def test_tau_fraction_refusals_name_the_culprit(change, message, tmp_path):
    with pytest.raises(UserError, match=message):
        plan_runs(SweepConfig(**{**GRID, **change}), tmp_path)


def test_lr_from_with_too_few_horizons_is_one_line(tuning_csv, tmp_path):
    two = tmp_path / "two.csv"
    lines = tuning_csv.read_text().splitlines()
    two.write_text("\n".join([lines[0]] + [x for x in lines[1:] if ",12582912," not in x]) + "\n")
    out = sweep(tmp_path, GRID, f"lr_from={two}")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "needs >= 3" in out.stderr


def test_lr_from_notes_a_ladder_that_drops_the_tuning_timescale(tmp_path, capsys):
    """Tuning runs with a per-run weight decay (tau_fraction), a ladder without: one note on stderr; with it, none."""
    records = [record(a, t, lr, s, tmp_path) for a in BETA for t in BUDGETS for lr in LRS for s in (1, 2)]
    for r in records:
        r.axes["optim.weight_decay"] = 0.1
    path = tmp_path / "tuned.csv"
    path.write_text(to_csv(records, tmp_path))
    with_lr_from(SweepConfig(**{**GRID, "tau_fraction": None}), str(path))
    assert "sets none, so its runs leave the timescale the lrs were tuned at" in capsys.readouterr().err
    with_lr_from(SweepConfig(**GRID), str(path))
    assert "note:" not in capsys.readouterr().err
