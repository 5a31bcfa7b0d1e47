"""`diffllm runs [DIR]`: the overview of a folder of runs, read from the runs' own files, from the real CLI."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.distributed import run_train
from tests.train.helpers import SESSION, tiny


@pytest.fixture(scope="module")
def folder(tokenizer):
    """runs/finished (8 steps of 1024 tokens, checkpoints at 4 and 8), runs/sweep/stopped (the same run as a kill
    after step 4 leaves it: no summary.json, latest -> step4), runs/damaged (a cut summary.json)."""
    root = SESSION / "overview"
    done = root / "finished"
    run_train(tiny(done, 0, "trainer.tokens=8192", "model=diff-tiny"), 1, SESSION / "overview-logs", launcher="plain")
    stopped = root / "sweep" / "stopped"
    shutil.copytree(done, stopped)
    (stopped / "summary.json").unlink()
    shutil.rmtree(stopped / "checkpoints" / "step8")
    (stopped / "checkpoints" / "latest").write_text("step4")
    damaged = root / "damaged"
    shutil.copytree(done, damaged)
    (damaged / "summary.json").write_text('{"model": "diff-ti')
    return root


def test_runs_lists_each_run_with_its_budget_status_loss_and_checkpoint(diffllm, folder):
    r = diffllm("runs", str(folder))
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["run", "model", "arch", "tokens", "status", "val", "loss", "checkpoint"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    summary = json.loads((folder / "finished" / "summary.json").read_text())
    val = f"{summary['final_val_loss']:.3f}"
    assert rows["finished"] == ["finished", "diff-tiny", "diff", "8,192/8,192", "finished", val, "step8"]
    # stopped after step 4: 4 steps of 1024 tokens of its 8192, its last val loss from metrics.jsonl (step <= 8)
    metrics = [json.loads(x) for x in (folder / "sweep" / "stopped" / "metrics.jsonl").read_text().splitlines()]
    last_val = [m["val_loss"] for m in metrics if m.get("val_loss") is not None][-1]
    stopped = rows["sweep/stopped"]
    assert stopped[:6] == ["sweep/stopped", "diff-tiny", "diff", "4,096/8,192", "stopped", "50%"]
    assert stopped[6:] == [f"{last_val:.3f}", "step4"]
    assert rows["damaged"][1:] == ["damaged:", str(folder / "damaged" / "summary.json")]  # the others still listed


def test_runs_refuses_a_folder_without_runs_in_one_line(diffllm, tmp_path):
    r = diffllm("runs", f"dir={tmp_path}")
    assert (r.code, r.out) == (2, "")
    assert (
        r.err.strip() == f"diffllm runs: error: dir={tmp_path}: no runs found (no summary.json, metrics.jsonl or "
        "checkpoints/ below it)"
    )
    r = diffllm("runs", str(tmp_path / "absent"))
    assert r.code == 2 and r.err.strip().endswith(f"dir={tmp_path / 'absent'}: no such directory")
