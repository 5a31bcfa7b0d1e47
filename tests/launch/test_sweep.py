"""Sweep grid generation (budgets, seeds, run directories, skipping finished runs), the multirun commands, and
`collect` over synthetic run directories."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from diffllm.config import compose
from diffllm.model.accounting import model_stats
from diffllm.model.presets import load_preset
from diffllm.results import read_csv, to_csv
from diffllm.sweep.collect import collect, write_tables
from diffllm.sweep.grid import SweepConfig, budgets, multirun_commands, plan_runs, shard_runs, token_label

REPO = Path(__file__).resolve().parents[2]


def _summary(run_dir: Path, model: str, loss: float, status: str = "finished", **extra) -> None:
    s = model_stats(load_preset(model))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": asdict(load_preset(model))}))  # its model config
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "model": model,
                "arch": load_preset(model).arch,
                "total_params": s.total_params,
                "nonembedding_params": s.nonembedding_params,
                "tokens": 131072,
                "flops": 1e12,
                "final_train_loss": loss + 0.1,
                "final_val_loss": loss,
                "wall_time_s": 12.5,
                "world_size": 1,
                "status": status,
                **extra,
            }
        )
    )


def test_grid_budgets_seeds_and_dirs(tmp_path):
    grid = SweepConfig(
        models=["transformer-micro-1", "diff-micro-1", "diff-micro-2"],
        tokens=["1M"],
        tokens_by_model={"diff-micro-2": ["2M", "3M"]},
        seeds=[1],
        seeds_by_model={"diff-micro-1": [1, 2]},
        round_tokens_to=2048,
    )
    runs = plan_runs(grid, tmp_path)
    assert [(r.model, r.tokens, r.seed) for r in runs] == [
        ("transformer-micro-1", 1001472, 1),
        ("diff-micro-1", 1001472, 1),
        ("diff-micro-1", 1001472, 2),
        ("diff-micro-2", 2000896, 1),
        ("diff-micro-2", 3000320, 1),
    ]  # rounded up to whole 2048-token steps
    assert runs[0].run_dir == tmp_path / "transformer-micro-1" / "1001472" / "seed1"
    assert token_label(2_000_000) == "2M" and token_label(131072) == "131072" and token_label(10**12) == "1T"


def test_tokens_per_param_rule():
    grid = SweepConfig(models=["diff-830m"], tokens_per_param=[20], params="total")
    assert budgets(grid, "diff-830m") == [20 * model_stats(load_preset("diff-830m")).total_params]


def test_multirun_commands_skip_finished(tmp_path):
    grid = SweepConfig(
        models=["transformer-micro-1", "diff-micro-1"], tokens=["64K"], seeds=[7], overrides=["trainer.zero_stage=0"]
    )
    runs = plan_runs(grid, tmp_path)
    _summary(runs[0].run_dir, "transformer-micro-1", 5.0)
    (runs[1].run_dir / "checkpoints").mkdir(parents=True)  # started, not finished: resumes
    assert [r.status for r in runs] == ["finished", "unfinished"]
    pending = [r for r in runs if r.status != "finished"]
    (cmd,) = multirun_commands(pending, grid, tmp_path, ["hydra/launcher=submitit_slurm"])
    assert cmd[1:4] == ["-m", "diffllm.sweep.job", "--multirun"]
    assert "model=diff-micro-1" in cmd and "trainer.tokens=64000" in cmd and "seed=7" in cmd and "data.seed=7" in cmd
    assert f'run_dir="{tmp_path}/${{model.name}}/64K/seed7"' in cmd and "trainer.resume=auto" in cmd
    assert cmd[-1] == "hydra/launcher=submitit_slurm" and "trainer.zero_stage=0" in cmd


def test_job_overrides_compose_into_the_train_config(tmp_path):
    """The run_dir interpolation in a multirun command resolves per model in the train config."""
    grid = SweepConfig(models=["diff-micro-1"], tokens=["64K"], seeds=[3], overrides=["data.seq_len=128"])
    (cmd,) = multirun_commands(plan_runs(grid, tmp_path), grid, tmp_path, [])
    overrides = [a for a in cmd[4:] if not a.startswith("hydra.")]
    cfg = compose("train", overrides)
    assert cfg.run_dir == str(tmp_path / "diff-micro-1" / "64K" / "seed3")
    assert (cfg.model.name, cfg.seed, cfg.data.seq_len) == ("diff-micro-1", 3, 128)


def test_micro_sweep_config_is_a_valid_grid():
    cfg = compose("sweep")
    from diffllm.config import build

    grid = build(SweepConfig, cfg.sweep, "sweep")
    runs = plan_runs(grid, "/nonexistent")
    stats = {r.model: model_stats(load_preset(r.model)) for r in runs}
    block = {m: s.nonembedding_params - s.embedding_params for m, s in stats.items()}  # untied heads
    for arch in ("transformer-", "diff-", "diff2-"):
        ns = [n for m, n in block.items() if m.startswith(arch)]
        assert len(ns) >= 4 and max(ns) / min(ns) >= 8
    for m in block:
        assert load_preset(m).n_heads >= 4  # the Diff Transformer gets >= 2 diff heads
    for r in runs:
        assert r.tokens / (r.tokens // 1536) == 1536 and r.tokens // 1536 >= 1000  # >= 1000 steps
        if not r.model.endswith("-4"):  # >= 20 tokens per block parameter where it fits the CPU budget
            assert r.tokens >= 20 * block[r.model]
    # 5 learning rates (6 at micro-2: the later glob wins) x 2 seeds for every preset, x 2 lambda_init choices for
    # the Diff Transformer
    assert sum(r.model == "diff-micro-1" for r in runs) == 20 and sum(r.model == "diff2-micro-4" for r in runs) == 10
    assert (
        sum(r.model == "diff-micro-2" for r in runs) == 24 and sum(r.model == "transformer-micro-2" for r in runs) == 12
    )
    assert len(runs) == 168


def test_grid_axes_per_model_and_their_run_dirs(tmp_path):
    grid = SweepConfig(
        models=["transformer-micro-1", "diff-micro-1", "diff-micro-3"],
        tokens=["64K"],
        seeds=[1, 2],
        grid={"optim.lr": [1e-3, 2e-3]},
        grid_by_model={"*-micro-3": {"optim.lr": [3e-05]}, "diff-*": {"model.lambda_init": [None, 0.8]}},
    )
    runs = plan_runs(grid, tmp_path)
    points = {(r.model, r.axes, r.seed) for r in runs}
    assert len(runs) == len(points) == 2 * 2 + 2 * 2 * 2 + 1 * 2 * 2
    assert ("diff-micro-3", (("optim.lr", 3e-05), ("model.lambda_init", None)), 2) in points
    assert ("transformer-micro-1", (("optim.lr", 0.002),), 1) in points
    d = next(
        r.run_dir
        for r in runs
        if r.model == "diff-micro-1" and r.seed == 2 and r.axes[1][1] == 0.8 and r.axes[0][1] == 1e-3
    )
    assert d == tmp_path / "diff-micro-1" / "64K" / "lr=0.001,lambda_init=0.8" / "seed2"
    commands = multirun_commands(runs, grid, tmp_path, [])
    assert len(commands) == 2 * (2 + 4 + 2)  # per seed: transformer lrs, diff-micro-1 lr x lambda, diff-micro-3
    for cmd in commands:  # every command composes into train configs whose run_dir is that of a planned run
        overrides = [a for a in cmd[4:] if not a.startswith("hydra.")]
        for model in next(a for a in overrides if a.startswith("model=")).split("=", 1)[1].split(","):
            cfg = compose("train", [o if not o.startswith("model=") else f"model={model}" for o in overrides])
            run = next(r for r in runs if r.run_dir == Path(cfg.run_dir))
            assert (cfg.model.name, cfg.seed, cfg.data.seed) == (run.model, run.seed, run.seed)
            assert [(k, cfg.optim.lr if k == "optim.lr" else cfg.model.lambda_init) for k, _ in run.axes] == list(
                run.axes
            )


@pytest.mark.parametrize(
    "grid, message",
    [
        (
            {"grid_by_model": {"difff-*": {"optim.lr": [1e-3]}}},
            "sweep.grid_by_model: 'difff-*' matches none of sweep.models",
        ),
        (
            {"grid": {"optim.lr": [1e-3]}, "overrides": ["optim.lr=2e-3"]},
            "sweep.grid.optim.lr: optim.lr is also in sweep.overrides",
        ),
        ({"grid": {"seed": [1, 2]}}, "sweep.grid.seed: seed is set by the sweep itself"),
        ({"grid": {"optim.lr": []}}, "sweep.grid.optim.lr: expected a non-empty list of values"),
    ],
)
def test_bad_grid_axes_are_one_line_errors(grid, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("*", r"\*")):
        plan_runs(SweepConfig(models=["diff-micro-1"], tokens=["64K"], **grid), "/tmp/x")


def test_shards_split_the_grid_exactly():
    grid = SweepConfig(
        models=["transformer-micro-1", "diff-micro-1"], tokens=["64K"], seeds=[1, 2, 3], grid={"optim.lr": [1e-3, 2e-3]}
    )
    runs = plan_runs(grid, "/tmp/x")
    parts = [shard_runs(runs, f"{i}/3") for i in range(3)]
    assert sorted(r.run_dir for p in parts for r in p) == sorted(r.run_dir for r in runs)
    assert all(len(p) == len(runs) // 3 for p in parts)
    with pytest.raises(ValueError, match=r"^shard=3/3: expected i/n with 0 <= i < n"):
        shard_runs(runs, "3/3")


def test_tokens_per_block_param_rule():
    grid = SweepConfig(models=["diff-micro-2"], tokens_per_param=[20], params="block")
    s = model_stats(load_preset("diff-micro-2"))
    assert budgets(grid, "diff-micro-2") == [20 * (s.nonembedding_params - s.embedding_params)]


def test_collect_tables(tmp_path):
    _summary(tmp_path / "transformer-micro-1" / "131072" / "seed1234", "transformer-micro-1", 5.5)
    _summary(tmp_path / "diff-micro-1" / "131072" / "seed1235", "diff-micro-1", 5.4, seed=1235)
    unfinished = tmp_path / "diff-micro-2" / "131072" / "seed1234"
    unfinished.mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text('{"step": 1, "loss": 6.0}\n')
    records = collect(tmp_path)
    assert [(r.model, r.seed, r.status) for r in records] == [
        ("diff-micro-1", 1235, "finished"),
        ("diff-micro-2", 1234, "unfinished"),
        ("transformer-micro-1", 1234, "finished"),
    ]
    t = records[2]
    s = model_stats(load_preset("transformer-micro-1"))
    assert t.block_params == s.nonembedding_params - s.embedding_params  # minus the untied output head
    csv_path, md_path = write_tables(records, tmp_path, tmp_path / "out")
    assert read_csv(csv_path) == records
    rows = list(csv.DictReader(open(csv_path)))
    assert rows[0]["final_val_loss"] == "5.4" and rows[1]["final_val_loss"] == ""
    md = md_path.read_text()
    assert "| diff-micro-2 | diff | 1234 |" in md and "unfinished" in md
    assert to_csv(records, csv_path.parent) == csv_path.read_text()  # run paths relative to the table


def test_collect_bad_dirs(tmp_path):
    with pytest.raises(ValueError, match=f"sweep_dir={tmp_path}/missing: no such directory"):
        collect(tmp_path / "missing")
    with pytest.raises(ValueError, match="no runs found"):
        collect(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.mark.slow
def test_cli_dry_run_and_errors(tmp_path):
    out = _cli("sweep", f"sweep_dir={tmp_path}", "dry_run=true")
    assert out.returncode == 0, out.stderr
    assert "168 runs: 0 finished (skipped), 168 to run" in out.stdout and out.stdout.count("--multirun") == 66
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    missing = _cli("sweep", "collect", f"sweep_dir={tmp_path}/nope")
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"diffllm sweep collect: error: sweep_dir={tmp_path}/nope: no such directory"
    )
    bad = _cli("sweep", f"sweep_dir={tmp_path}", "dry_run=true", "sweep.models=[diff-micro-9]")
    assert bad.returncode == 2 and "model=diff-micro-9: unknown preset" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_job_multirun_skips_finished_runs(tmp_path):
    """The real Hydra multirun (basic launcher) over two models whose runs are finished: both skipped, nothing
    trains, exit 0; Hydra writes only under the sweep directory."""
    for model in ("transformer-micro-1", "diff-micro-1"):
        _summary(tmp_path / model, model, 5.0)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffllm.sweep.job",
            "--multirun",
            "model=transformer-micro-1,diff-micro-1",
            f"run_dir={tmp_path}/${{model.name}}",
            f"hydra.sweep.dir={tmp_path}/.multirun",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("finished, skipped") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".multirun", "diff-micro-1", "transformer-micro-1"]
