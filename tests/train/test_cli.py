"""`diffllm train` as a user runs it: one plain process (no launcher variables), from a clean folder; relaunching
resumes, trainer.resume=none starts afresh, bad input is one line that names the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.distributed import base_env
from tests.train.helpers import TINY

pytestmark = pytest.mark.slow
ARGS = [a for a in TINY if not a.startswith("trainer.tokens=")] + ["trainer.tokens=4096", "run_dir=runs/tiny"]
METRIC_KEYS = {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"}
SUMMARY_KEYS = {
    "model",
    "arch",
    "total_params",
    "nonembedding_params",
    "tokens",
    "flops",
    "final_train_loss",
    "final_val_loss",
    "wall_time_s",
    "world_size",
    "status",
}


def diffllm_train(cwd, *args: str) -> subprocess.CompletedProcess:
    """No launcher variables at all (RANK, WORLD_SIZE, ...): the trainer makes itself a world of one."""
    env = {k: v for k, v in base_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "train", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_resume_and_fresh_start_in_a_clean_folder(tokenizer, tmp_path):
    first = diffllm_train(tmp_path, *ARGS)
    assert first.returncode == 0, first.stdout + first.stderr
    assert os.listdir(tmp_path) == ["runs"]  # Hydra wrote nothing (no outputs/, no .hydra/)
    run = tmp_path / "runs" / "tiny"
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "tokenizer.json",
    ]
    out = first.stdout
    assert "step 0: val_loss" in out and "step 4: val_loss" in out and "MFU n/a" in out and "ETA" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(METRIC_KEYS <= set(r) for r in records if "loss" in r) and len([r for r in records if "loss" in r]) == 4
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary) and summary["world_size"] == 1 and summary["tokens"] == 4096
    assert summary["model"] == "diff-tiny" and summary["arch"] == "diff" and summary["status"] == "finished"
    # config.yaml is the config that was trained: the model's vocabulary is the tokenizer's (the preset says 8192)
    config = yaml.safe_load((run / "config.yaml").read_text())
    meta = json.loads((run / "checkpoints" / "step4" / "meta.json").read_text())
    assert config["model"]["vocab_size"] == meta["model"]["vocab_size"] == 1024

    # What a save killed half-way leaves behind: shards under the temporary tag, never published as `latest`.
    partial = run / "checkpoints" / "tmp-step8"
    partial.mkdir()
    shard = "mp_rank_00_model_states.pt"
    (partial / shard).write_bytes((run / "checkpoints" / "step4" / shard).read_bytes()[:1000])  # cut short
    again = diffllm_train(tmp_path, *ARGS)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "removing runs/tiny/checkpoints/tmp-step8 (a save that never completed)" in again.stdout
    assert (
        not partial.exists()
        and "runs/tiny/checkpoints/step4: the finished run's last checkpoint (step 4" in again.stdout
    )
    assert "already at its budget" in again.stdout
    assert json.loads((run / "summary.json").read_text())["final_val_loss"] == summary["final_val_loss"]

    fresh = diffllm_train(tmp_path, *ARGS, "trainer.resume=none")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "moved the previous run's checkpoints, metrics.jsonl, summary.json" in fresh.stdout
    assert "resumed" not in fresh.stdout
    moved = [p for p in run.iterdir() if p.name.startswith("replaced-")]
    assert len(moved) == 1 and (moved[0] / "checkpoints" / "step4").is_dir()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()][:2] == [0, 1]

    other = diffllm_train(tmp_path, *ARGS, "model.n_layers=3")  # not this run's architecture
    assert other.returncode == 2 and "diffllm train: error: model.n_layers: the checkpoint" in other.stderr, (
        other.stderr
    )


@pytest.mark.parametrize(
    "override, culprit",
    [
        ("trainer.tokens=1000", "trainer.tokens=1000: not a whole number of steps"),
        ("trainer.global_batch_tokens=1000", "trainer.global_batch_tokens=1000 is not a multiple"),
        ("trainer.resume=/nonexistent/ckpt", "trainer.resume=/nonexistent/ckpt: no such checkpoint"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tokenizer, tmp_path, override, culprit):
    done = diffllm_train(tmp_path, *ARGS, override)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [f"diffllm train: error: {errors[0].split('error: ', 1)[1]}"] and culprit in errors[0]
