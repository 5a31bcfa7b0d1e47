"""Real 2-rank DeepSpeed training on real Shakespeare (gloo, CPU): loss falls under ZeRO 1/2/3, exact resume after
SIGKILL and SIGTERM, resume on 1 rank from 2, zero_to_fp32 round trip, and non-finite steps."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal

import pytest
import torch
import torch.nn.functional as F

from diffllm.runs import Run, find_checkpoint, read_metrics
from tests.distributed import launch_train, run_train
from tests.train.helpers import STEPS, comparable, tiny

pytestmark = pytest.mark.slow


def train_losses(run_dir) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if "loss" in m]


def val_losses(run_dir) -> list[float]:
    return [m["val_loss"] for m in read_metrics(run_dir) if "val_loss" in m]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_loss_falls_on_two_ranks(reference, stage):
    """ZeRO-1 runs under real torchrun, ZeRO-2/3 as one process per rank; ZeRO-3 with activation checkpointing."""
    run_dir = reference(stage)
    train, val = train_losses(run_dir), val_losses(run_dir)
    assert len(train) == STEPS and len(val) == 2
    assert val[-1] < val[0] - 0.8, val  # ln(1024) = 6.93 at init
    assert sum(train[-4:]) / 4 < train[0] - 0.7, train
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["world_size"] == 2 and summary["tokens"] == STEPS * 1024
    assert summary["last_val_loss"] == val[-1] and summary["final_train_loss"] == train[-1]
    assert summary["final_val"]["tokens"] > 4000 and summary["final_val_loss"] == summary["final_val"]["loss"]
    assert summary["flops"] == summary["flops_per_token"] * summary["tokens"]
    assert find_checkpoint(run_dir / "checkpoints").step == STEPS
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["latest", "step12", "step16", "step8", "zero_to_fp32.py", "zero_to_torch.py"]  # keep_last=3


@pytest.mark.parametrize("stage", [2, 3])
def test_exact_resume_after_sigkill(reference, stage, tmp_path):
    """SIGKILL mid-run (after at least one checkpoint): under ZeRO-2 both ranks; under ZeRO-3 only rank 1, and the
    surviving rank 0 must end by itself (a dead rank ends the job, it does not hang it). Relaunching the same command
    continues from the last complete checkpoint, and every later loss equals the uninterrupted run's bit for bit,
    even when the kill cut the last metrics.jsonl record short."""
    run_dir = tmp_path / "run"
    args = tiny(run_dir, stage, workers=True)
    run = launch_train(args, 2, tmp_path / "logs1")
    run.wait_until(lambda: any(m.get("step", 0) >= 6 for m in read_metrics(run_dir)))
    if stage == 2:
        run.kill()
    else:
        run.kill(ranks=[1])
        assert run.procs[0].wait(timeout=120) != 0, run.output(0)
    killed_at = max(m["step"] for m in read_metrics(run_dir))
    with open(run_dir / "metrics.jsonl", "a") as f:  # what a kill during the append of a record leaves
        f.write('{"step": %d, "loss": 5.' % (killed_at + 1))  # noqa: UP031
    resumed = run_train(args, 2, tmp_path / "logs2")
    out = resumed.output(0)
    assert "resumed from checkpoint" in out, out
    resumed_from = int(re.search(r"resumed from checkpoint \S+: step (\d+),", out).group(1))
    assert 4 <= resumed_from <= killed_at
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(reference(stage)))


def test_sigterm_saves_exits_3_and_relaunch_continues(reference, tmp_path):
    """SIGTERM to every rank (as SLURM preemption does): the step finishes, a checkpoint is saved, exit code 3; the
    relaunch continues exactly (bit for bit against the uninterrupted ZeRO-1 run, which ran under torchrun) and
    reuses the W&B run id (offline W&B)."""
    run_dir = tmp_path / "run"
    args = tiny(run_dir, 1, "trainer.save_every_steps=0", workers=True)
    env = {"WANDB_MODE": "offline"}
    run = launch_train(args, 2, tmp_path / "logs1", env=env)
    run.wait_until(lambda: any(m.get("step", 0) >= 3 for m in read_metrics(run_dir)))
    run.send(signal.SIGTERM)
    assert run.wait(120) == [3, 3], run.output(0)
    out = run.output(0)
    assert "SIGTERM received" in out and "relaunch the same command to continue (exit code 3)" in out
    stopped = find_checkpoint(run_dir / "checkpoints").step
    assert 3 <= stopped < STEPS and max(m["step"] for m in read_metrics(run_dir)) == stopped
    run_train(args, 2, tmp_path / "logs2", env=env)
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(reference(1)))
    ids = {p.name.rsplit("-", 1)[1] for p in (run_dir / "wandb").glob("offline-run-*")}
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 2 and len(ids) == 1, ids


def test_resume_two_ranks_to_one_through_universal_checkpoint(reference, tmp_path):
    """Continue the ZeRO-2 reference's step-8 checkpoint on one rank: DeepSpeed's universal conversion, the data
    streams continue exactly, and the later losses agree with the 2-rank run to reduction-order rounding."""
    ref = reference(2)
    run_dir = tmp_path / "run"
    shutil.copytree(ref / "checkpoints" / "step8", run_dir / "checkpoints" / "step8")
    (run_dir / "checkpoints" / "latest").write_text("step8")
    done = run_train(tiny(run_dir, 2, workers=True), 1, tmp_path / "logs")
    assert "world size 2 -> 1" in done.output(0)
    assert (run_dir / "checkpoints" / "step8_universal").is_dir()
    ours = {m["step"]: m for m in read_metrics(run_dir) if "loss" in m}
    theirs = {m["step"]: m for m in read_metrics(ref) if "loss" in m and m["step"] > 8}
    assert sorted(ours) == sorted(theirs)
    for step, m in theirs.items():
        assert ours[step]["loss"] == pytest.approx(m["loss"], abs=2e-5), step
    assert val_losses(run_dir)[-1] == pytest.approx(val_losses(ref)[-1], abs=2e-5)
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 1


def test_zero_to_fp32_round_trip_reproduces_the_trained_model(reference, tokenizer):
    """DeepSpeed's zero_to_fp32 on the ZeRO-3 reference's final checkpoint loads strictly into DecoderLM, and its
    logits give the held-out loss that the 2-rank engine reported at the end of training."""
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, build_val_batches

    run_dir = reference(3)
    _, model, _ = Run(run_dir / "checkpoints" / f"step{STEPS}").model(tokenizer=False)
    data = build(DataConfig, compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"]).data, "data")
    batches = [b.tokens for b in build_val_batches(data, tokenizer, 4, 4, max_tokens=4096)]  # TINY
    with torch.no_grad():
        total = sum(
            F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten(), reduction="sum").item() for b in batches
        )
    ours = total / sum(b[:, 1:].numel() for b in batches)
    reported = json.loads((run_dir / "summary.json").read_text())["last_val_loss"]  # the in-loop set
    assert ours == pytest.approx(reported, abs=1e-5)
    assert model.tok_embeddings.weight.shape == (1024, 64)


def test_nonfinite_steps_are_skipped_then_the_run_stops(reference, tmp_path):
    """A NaN loss on rank 0 only (trainer.faults.nan_at_steps) makes both ranks skip that update: the weights after
    the step equal those before it, the run carries on; two NaN steps in a row stop it with exit code 4."""
    run_dir = tmp_path / "run"
    args = tiny(
        run_dir,
        2,
        "trainer.faults.nan_at_steps=[3,6,7]",
        "trainer.max_nonfinite_in_a_row=2",
        "trainer.save_every_steps=1",
        "trainer.keep_last=20",
        workers=True,
    )
    run = run_train(args, 2, tmp_path / "logs", expect=4)
    assert "2 steps in a row had a non-finite loss or gradient (step 7)" in run.output(0)
    recs = {m["step"]: m for m in read_metrics(run_dir) if "loss" in m}
    ref = {m["step"]: m for m in read_metrics(reference(2)) if "loss" in m}
    assert [recs[s]["loss"] for s in (1, 2)] == [ref[s]["loss"] for s in (1, 2)]
    assert recs[3]["loss"] is None and recs[3]["nonfinite"] and recs[3]["skipped"] and recs[3]["skipped_steps"] == 1
    assert all(math.isfinite(recs[s]["loss"]) and not recs[s]["skipped"] for s in (4, 5))
    assert recs[7]["skipped_steps"] == 3 and 8 not in recs
    weights = {s: Run(run_dir).model(step=s, tokenizer=False)[1].state_dict() for s in (2, 3, 4)}
    assert all(torch.equal(weights[2][k], weights[3][k]) for k in weights[2])  # step 3 was skipped
    assert not all(torch.equal(weights[3][k], weights[4][k]) for k in weights[3])  # step 4 was not
