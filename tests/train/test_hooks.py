"""Hooks around the loop: a user hook sees every event of a real run and adds keys to its records without changing
its numerics (the golden losses); against a View alone: the window statistics (mean loss over the log window, time,
elapsed seconds), a hook's keys and records through the one writer, save timing, fault injection."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from diffllm.runs import read_metrics
from diffllm.train.faults import FaultInjection, fault_hooks
from diffllm.train.hooks import Checkpointing, Hook, Hooks, StepMetrics
from diffllm.train.metrics import MetricsWriter
from tests.distributed import base_env
from tests.train.golden import args_for, check_golden, golden_path, run_records
from tests.train.helpers import make_view

RECORDER = textwrap.dedent("""
    import json, sys
    from diffllm.config import compose
    from diffllm.train.config import TrainConfig
    from diffllm.train.hooks import Hook
    from diffllm.train.loop import Trainer

    class Recorder(Hook):
        def __init__(self):
            self.events = []
        def on_start(self, trainer):
            self.events.append(["start", trainer.state.step])
        def on_step_end(self, trainer, record):
            self.events.append(["step", record["step"]])
            return {"my_key": record["step"] * 10}  # a key of its own in the step's record
        def on_validate(self, trainer, losses):
            self.events.append(["validate", trainer.state.step, sorted(losses)])
        def on_save(self, trainer, tag):
            self.events.append(["save", tag])
        def on_finish(self, trainer, summary):
            self.events.append(["finish", summary["steps"]])
        def close(self, trainer):
            self.events.append(["close"])
            print(json.dumps(self.events))

    cfg = TrainConfig.from_hydra(compose("train", sys.argv[1:]))
    sys.exit(Trainer(cfg, hooks=[Recorder()]).run())
""")


@pytest.mark.slow
def test_a_user_hook_sees_every_event_and_leaves_the_golden_losses_unchanged(tokenizer, tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in base_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-c", RECORDER, *args_for("diff-tiny"), "trainer.save_every_steps=8", f"run_dir={run_dir}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    events = json.loads(done.stdout.strip().splitlines()[-1])
    assert events[:2] == [["validate", 0, ["val"]], ["start", 0]]  # the built-in Validation starts first
    assert [e[1] for e in events if e[0] == "step"] == list(range(1, 21))
    assert [e for e in events if e[0] in ("save", "validate")] == [
        ["validate", 0, ["val"]],
        ["save", "step8"],
        ["validate", 10, ["val"]],
        ["save", "step16"],
        ["validate", 20, ["val"]],
        ["save", "step20"],
    ]
    assert events[-2:] == [["finish", 20], ["close"]]
    steps = [r for r in read_metrics(run_dir) if "loss" in r]
    assert steps and all(r["my_key"] == 10 * r["step"] for r in steps)  # in every step record written
    check_golden(golden_path("diff-tiny"), args_for("diff-tiny"), run_records(run_dir))  # saving changes no number


def step_record(step: int, loss, skipped: bool = False) -> dict:
    return {
        "step": step,
        "tokens": 1024 * step,
        "loss": loss,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "skipped": skipped,
        "step_time_s": 0.5,
    }


def writer_for(tmp_path, steps: int, log_every: int) -> MetricsWriter:
    writer = MetricsWriter(0, log_every, steps, steps * 1024, 1024)
    writer.open(tmp_path, 0, lambda: None, print)
    return writer


def test_metrics_window_mean_loss_time_and_elapsed(tmp_path):
    """log_every=3: the record at step 3 has the last step's loss and the mean of steps 1-3; a skipped (non-finite)
    step is recorded at once, with no mean (no finite loss in its window)."""
    view = make_view(tmp_path, steps=10, elapsed=lambda: 12.5)
    hooks = Hooks([StepMetrics(log_every=3, flops_per_token=1.0, peak=None)], view)
    writer = writer_for(tmp_path, 10, 3)
    for step, loss in ((1, 3.0), (2, 2.5), (3, 1.0), (4, None)):
        view.state.step = step
        writer.step(hooks.step_end(step_record(step, loss, skipped=loss is None)))
    first, second = read_metrics(tmp_path)
    assert (first["step"], first["loss"], first["loss_mean"]) == (3, 1.0, pytest.approx((3.0 + 2.5 + 1.0) / 3))
    assert first["tokens_per_s"] == pytest.approx(3 * 1024 / 1.5) and first["elapsed_s"] == 12.5
    assert first["time"] > 1.7e9 and "step_time_s" not in first
    assert (second["step"], second["loss"], second["loss_mean"], second["nonfinite"]) == (4, None, None, True)


def test_a_hooks_keys_are_in_every_written_record_and_its_own_records_follow_the_step(tmp_path):
    """A hook returns keys for the step's record (a later hook sees an earlier one's) and logs a record of its own:
    the step's record is written once, after every hook, with all their keys; the hook's own record after it."""

    class Mine(Hook):
        def on_step_end(self, view, record):
            view.log({"step": record["step"], "tokens": record["tokens"], "mine": True})
            return {"my_key": 10 * record["step"], "saw_mean": record.get("loss_mean")}

    writer = writer_for(tmp_path, 4, 2)
    view = make_view(tmp_path, steps=4, log=writer.add)
    hooks = Hooks([StepMetrics(log_every=2, flops_per_token=1.0, peak=None), Mine()], view)
    for step in (1, 2, 3, 4):
        view.state.step = step
        writer.step(hooks.step_end(step_record(step, 1.0 * step)))
    records = read_metrics(tmp_path)
    assert [(r["step"], "loss" in r) for r in records] == [
        (1, False),
        (2, True),
        (2, False),
        (3, False),
        (4, True),
        (4, False),
    ]
    steps = [r for r in records if "loss" in r]
    assert [(r["my_key"], r["saw_mean"]) for r in steps] == [(20, 1.5), (40, 3.5)]

    class Writes(Hook):
        def on_step_end(self, view, record):
            record["x"] = 1

    with pytest.raises(TypeError):  # the record a hook sees is read-only: it adds keys by returning them
        Hooks([Writes()], view).step_end(step_record(5, 1.0))


def test_checkpointing_asks_every_n_steps_and_wishes_by_the_clock(tmp_path, monkeypatch):
    """every_steps: a request at each multiple; every_minutes: a wish (agreed across ranks) once this rank's clock
    passed it since the last save, and none after a save."""
    import diffllm.train.hooks as hooks_module

    now = [1000.0]
    monkeypatch.setattr(hooks_module.time, "monotonic", lambda: now[0])
    asked = []
    view = make_view(tmp_path, steps=10, request_save=lambda agree=False: asked.append((view.state.step, agree)))
    hook = Checkpointing(every_steps=4, every_minutes=1.0)
    hook.on_start(view)
    for step in range(1, 9):
        now[0] += 25.0  # a step takes 25 s: the clock passes the minute at the start of step 3
        before = len(asked)
        view.state.step = step - 1
        hook.on_step_start(view)
        view.state.step = step
        hook.on_step_end(view, step_record(step, 1.0))
        if len(asked) > before:  # the loop saves at the end of the step
            hook.on_save(view, f"step{step}")
    assert asked == [(2, True), (4, False), (6, True), (8, False)]


def test_fault_injection_nan_on_rank_0_and_a_spike_on_every_rank(tmp_path):
    from diffllm.train.config import FaultsConfig

    hook = FaultInjection(FaultsConfig(nan_at_steps=[2], loss_scale_at_steps=[3], loss_scale=10.0))
    loss = torch.tensor(2.0)
    for rank in (0, 1):
        view = make_view(tmp_path, steps=4, rank=rank)
        got = []
        for step in range(3):  # the step being made is state.step + 1
            view.state.step = step
            got.append(float(hook.on_loss(view, loss)))
        assert got[0] == 2.0 and math.isnan(got[1]) == (rank == 0) and got[2] == 20.0
    assert fault_hooks(FaultsConfig()) == []
