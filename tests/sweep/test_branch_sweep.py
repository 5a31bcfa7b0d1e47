"""Branch mode of `diffllm sweep` (issue 22 section 2): the grid expands into one WSD stable run per (model, axes,
seed) and a cooldown per smaller budget, sharded by family; the dry run's FLOPs, tokens and GPU-hours in both modes
against a hand computation; and a real tiny branch sweep through `diffllm sweep` (a stable run, two cooldowns), its
collect accounting and a second invocation that runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from diffllm.config import compose
from diffllm.hardware import lookup
from diffllm.model.accounting import model_stats
from diffllm.model.presets import load_preset
from diffllm.results import find_axes, trained_compute, trained_wall
from diffllm.sweep.collect import collect, to_markdown
from diffllm.sweep.cost import Cluster, totals
from diffllm.sweep.grid import SweepConfig, multirun_commands, plan_runs, shard_runs
from tests.train.helpers import TINY

REPO = Path(__file__).resolve().parents[2]
B = 1536  # tokens a step
WSD = [
    "data.seq_len=128",
    f"trainer.global_batch_tokens={B}",
    "optim.schedule=wsd",
    "optim.warmup_steps=50",
    "optim.decay_fraction=0.2",
]


def grid(**kw) -> SweepConfig:
    base = dict(
        models=["transformer-micro-1", "diff-micro-1"],
        tokens=[800 * B, 200 * B, 400 * B],
        seeds=[1, 2],
        budget_mode="branch",
        overrides=WSD,
        grid_by_model={"diff-*": {"model.lambda_init": [None, 0.8]}},
    )
    return SweepConfig(**{**base, **kw})


def test_branch_grid_runs_overrides_and_dependencies(tmp_path):
    runs = plan_runs(grid(), tmp_path)
    # transformer: 2 seeds; diff: 2 lambda_init values x 2 seeds; each a stable run and 2 cooldowns
    assert len(runs) == (2 + 4) * 3
    stable = [r for r in runs if r.parent is None]
    assert all(r.tokens == 800 * B and r.branch_budgets == (200 * B, 400 * B) for r in stable)
    for r in runs:
        if r.parent is not None:  # the stable run of its own model, axes and seed, at the largest budget
            (p,) = [s for s in stable if s.run_dir == r.parent]
            assert (p.model, p.axes, p.seed, r.parent_tokens, r.branch_budgets) == (
                r.model,
                r.axes,
                r.seed,
                800 * B,
                (),
            )
            assert r.run_dir.relative_to(tmp_path).parts[1] == str(r.tokens)  # where scratch mode puts its budget
            assert r.run_dir.relative_to(tmp_path).parts[2:] == p.run_dir.relative_to(tmp_path).parts[2:]
    # the scratch grid has the same run directories, every budget from scratch
    scratch = plan_runs(grid(budget_mode="scratch"), tmp_path)
    assert {r.run_dir for r in scratch} == {r.run_dir for r in runs} and not any(r.parent for r in scratch)

    commands = multirun_commands(runs, grid(), tmp_path, [])
    kinds = []
    for cmd in commands:
        seed = int(next(a for a in cmd if a.startswith("seed=")).split("=")[1])
        tokens = int(next(a for a in cmd if a.startswith("trainer.tokens=")).split("=")[1])
        branch = [a for a in cmd if a.startswith("trainer.branch_")]
        if tokens == 800 * B:
            assert branch == [f"trainer.branch_budgets=[{200 * B},{400 * B}]"]
        else:  # the cooldown names the stable run of the model the multirun job composes
            folder = next(a for a in cmd if a.startswith("run_dir=")).split("/")[-2]
            folder = "" if folder == str(tokens) else f"/{folder}"
            assert branch == [f'trainer.branch_from="{tmp_path}/${{model.name}}/{800 * B}{folder}/seed{seed}"']
        kinds.append((seed, tokens != 800 * B))
    assert kinds == sorted(kinds)  # seed by seed, a seed's stable runs before its cooldowns
    # the job's overrides compose: branch_from resolves to the stable run's directory
    cool = next(c for c in commands if "trainer.branch_from" in " ".join(c) and "model.lambda_init=0.8" in c)
    job = [a for a in cool[4:] if not a.startswith("hydra.")]
    cfg = compose("train", [a.replace("model=transformer-micro-1,diff-micro-1", "model=diff-micro-1") for a in job])
    assert cfg.trainer.branch_from == f"{tmp_path}/diff-micro-1/{800 * B}/lambda_init=0.8/seed1"


def test_shards_keep_families_whole():
    runs = plan_runs(grid(), "s")
    shards = [shard_runs(runs, f"{i}/4") for i in range(4)]
    assert sorted(map(str, (r.run_dir for s in shards for r in s))) == sorted(str(r.run_dir) for r in runs)
    for s in shards:
        mine = {r.run_dir for r in s}
        assert all(r.parent in mine for r in s if r.parent)  # every cooldown is run by its stable run's shard
    assert [len(s) for s in shards] == [6, 6, 3, 3]  # 6 families of 3 runs dealt round-robin: 0,4 | 1,5 | 2 | 3


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(overrides=[o for o in WSD if "schedule" not in o]), "sweep.budget_mode=branch: .* optim.schedule=wsd"),
        (dict(overrides=WSD + ["trainer.branch_budgets=[1]"]), "trainer.branch_budgets is set by the sweep itself"),
        (dict(grid={"trainer.branch_from": ["x"]}), "sweep.grid.trainer.branch_from: .* set by the sweep itself"),
        (dict(budget_mode="cheap"), "sweep.budget_mode=cheap: expected one of scratch, branch"),
    ],
)
def test_bad_branch_configs_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        plan_runs(grid(**kw), "s")


def test_dry_run_totals_in_both_modes_by_hand():
    """Per family, budgets of 200, 400 and 800 steps: scratch trains 1400 steps; branch trains 800, and each cooldown
    its decay only: round(0.2 x 200) = 40 and 80 steps. GPU-hours: FLOPs / (H200 peak x MFU)."""
    cluster = Cluster("h200", nodes=1, gpus_per_node=4, mfu=0.5)
    scratch, branch = totals(grid(), cluster)
    flops = {m: model_stats(load_preset(m), 128).flops_per_token for m in ("transformer-micro-1", "diff-micro-1")}
    families = {"transformer-micro-1": 2, "diff-micro-1": 4}
    steps = {"scratch": 200 + 400 + 800, "branch": 800 + 40 + 80}
    for t in (scratch, branch):
        assert t.runs == 18
        assert t.tokens == sum(n * steps[t.mode] * B for n in families.values())
        want = sum(n * steps[t.mode] * B * flops[m] for m, n in families.items())
        assert t.flops == pytest.approx(want, rel=1e-12)
        assert t.gpu_hours == pytest.approx(want / (lookup("h200").bf16_tflops * 1e12 * 0.5) / 3600, rel=1e-9)
    # a scratch config is costed in branch mode too, with the same numbers
    assert totals(grid(budget_mode="scratch")) == [replace(scratch, gpu_hours=None), replace(branch, gpu_hours=None)]


def test_branch_budgets_is_no_axis():
    assert (
        find_axes(
            {
                ("m", 1): [
                    {"trainer.branch_budgets": (1, 2), "optim.lr": 1.0},
                    {"trainer.branch_budgets": (), "optim.lr": 1.0},
                ]
            }
        )
        == []
    )


# -------------------------------------------------------------------------------- a real tiny branch sweep
# Steps of 1024 tokens; WSD with 2 warmup steps, decay over the last half: budgets of 8 and 12 steps begin their decay
# at steps 4 and 6 of the 16-step stable run; the cooldowns train 4 and 6 steps.
TINY_SWEEP = {
    "name": "tiny-branch",
    "models": ["diff-tiny"],
    "tokens": [8192, 12288, 16384],
    "seeds": [1],
    "budget_mode": "branch",
    "overrides": [a for a in TINY if not a.startswith(("trainer.tokens=", "optim.warmup_steps="))]
    + [
        "optim.schedule=wsd",
        "optim.decay_fraction=0.5",
        "optim.warmup_steps=2",
        "trainer.zero_stage=0",
        "trainer.val_every=4",
    ],
}


def _sweep(config_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "sweep", "--config-dir", str(config_dir), "sweep=tiny-branch", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


@pytest.mark.slow
def test_a_tiny_branch_sweep_end_to_end(tmp_path, tokenizer):
    (tmp_path / "configs" / "sweep").mkdir(parents=True)
    (tmp_path / "configs" / "sweep" / "tiny-branch.yaml").write_text(yaml.safe_dump(TINY_SWEEP))
    root = tmp_path / "sweep"
    dry = _sweep(tmp_path / "configs", f"sweep_dir={root}", "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    flops = model_stats(compose_tiny().model, 64).flops_per_token
    assert f"scratch     3 runs  {36 * 1024:>22,} tokens  {36 * 1024 * flops:.4g} FLOPs" in dry.stdout, dry.stdout
    assert f"branch      3 runs  {26 * 1024:>22,} tokens  {26 * 1024 * flops:.4g} FLOPs" in dry.stdout, dry.stdout
    assert not root.exists()  # a dry run writes nothing

    done = _sweep(tmp_path / "configs", f"sweep_dir={root}")
    assert done.returncode == 0, done.stdout + done.stderr
    stable = root / "diff-tiny" / "16384" / "seed1"
    for tokens, step in ((8192, 4), (12288, 6)):
        branch = json.loads((root / "diff-tiny" / str(tokens) / "seed1" / "branch.json").read_text())
        assert (branch["parent"], branch["step"], branch["tokens"]) == (str(stable.resolve()), step, step * 1024)

    records = collect(root, select=None, baselines=False)
    assert [(r.tokens, r.branch_tokens, r.branch_parent) for r in records] == [
        (8192, 4096, str(stable.resolve())),
        (12288, 6144, str(stable.resolve())),
        (16384, None, None),
    ]
    # TINY's d_model 64 is not diff-tiny's own: the one width off the preset stays an axis (results.WIDTH_KEY), or
    # every run would read as the preset's width; nothing else varies
    assert all(r.status == "finished" and r.axes == {"model.d_model": 64} for r in records)
    per_token = records[0].flops / records[0].tokens
    assert trained_compute(records) == (26 * 1024, pytest.approx(26 * 1024 * per_token, rel=1e-12))
    table = to_markdown(records, root, select=None)
    assert "| diff-tiny/16384/seed1 @ 4,096 |" in table and "| - |" in table
    assert f"Trained in all: {26 * 1024:,} tokens" in table and "10,240 tokens that WSD cooldowns share" in table
    # wall time: the cooldowns' own steps (their wall_time_s less the parent's up to the branch), against every
    # budget at the stable run's time per token
    own = [r.wall_time_s - r.branch_wall_s for r in records[:2]]
    assert all(0 < x < r.wall_time_s for x, r in zip(own, records))
    wall = trained_wall(records)
    assert wall == pytest.approx((records[2].wall_time_s + sum(own), records[2].wall_time_s / 16384 * 36 * 1024))
    assert (
        f"from scratch at the same times per token: {wall[1]:,.0f} s (branch / scratch {wall[0] / wall[1]:.3f})"
        in table
    )

    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("summary.json")}
    again = _sweep(tmp_path / "configs", f"sweep_dir={root}")
    assert again.returncode == 0, again.stderr
    assert "3 runs: 3 finished (skipped), 0 to run" in again.stdout and "--multirun" not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in root.rglob("summary.json")} == mtimes


def compose_tiny():
    from diffllm.train.config import TrainConfig

    return TrainConfig.from_hydra(compose("train", ["model=diff-tiny", *TINY_SWEEP["overrides"]]))


def test_launch_preflight_refuses_a_bad_branch_budget():
    """`diffllm launch` checks branch budgets before it starts anything (the sweep's jobs get the same refusal)."""
    from diffllm.launch.checks import check_train_overrides

    good = [*TINY_SWEEP["overrides"], "trainer.tokens=16384", "trainer.branch_budgets=[8192]"]
    check_train_overrides(good, 1)
    with pytest.raises(ValueError, match=r"trainer.branch_budgets\[0\]=8000: not a whole number of steps"):
        check_train_overrides([*good[:-1], "trainer.branch_budgets=[8000]"], 1)
