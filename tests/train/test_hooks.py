"""Hooks around the loop: a user hook sees every event of a real run without changing its numerics (the golden
losses), and the metrics hook's window statistics (mean loss over the log window, time, elapsed seconds)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from diffllm.runs import read_metrics
from diffllm.train.config import LoggingConfig, TrainerConfig
from diffllm.train.hooks import MetricsLogger
from diffllm.train.state import TrainState
from tests.distributed import base_env
from tests.train.golden import args_for, check_golden, golden_path, run_records

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
    done = subprocess.run([sys.executable, "-c", RECORDER, *args_for("diff-tiny"), "trainer.save_every_steps=8", f"run_dir={run_dir}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    events = json.loads(done.stdout.strip().splitlines()[-1])
    assert events[:2] == [["validate", 0, ["val"]], ["start", 0]]  # the built-in Validation starts first
    assert [e[1] for e in events if e[0] == "step"] == list(range(1, 21))
    assert [e for e in events if e[0] in ("save", "validate")] == [
        ["validate", 0, ["val"]], ["save", "step8"], ["validate", 10, ["val"]], ["save", "step16"],
        ["validate", 20, ["val"]], ["save", "step20"]]
    assert events[-2:] == [["finish", 20], ["close"]]
    check_golden(golden_path("diff-tiny"), args_for("diff-tiny"), run_records(run_dir))  # saving changes no number


def test_metrics_window_mean_loss_time_and_elapsed(tmp_path):
    """log_every=3: the record at step 3 has the last step's loss and the mean of steps 1-3; a skipped (non-finite)
    step is recorded at once, with no mean (no finite loss in its window)."""
    state = TrainState(wandb_id="x")
    trainer = SimpleNamespace(rank=0, ws=1, state=state, trainer=TrainerConfig(log_every=3), peak=None,
                              budget=SimpleNamespace(steps=10, tokens=10240, global_batch_tokens=1024),
                              stats=SimpleNamespace(flops_per_token=1.0), run_dir=tmp_path, config={},
                              logging=LoggingConfig(wandb="disabled"), say=print, elapsed=lambda: 12.5,
                              already_finished=False)
    hook = MetricsLogger()
    hook.on_start(trainer)
    for step, loss in ((1, 3.0), (2, 2.5), (3, 1.0), (4, None)):
        state.step = step
        hook.on_step_end(trainer, {"step": step, "tokens": 1024 * step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
                                   "skipped": loss is None, "step_time_s": 0.5})
    first, second = read_metrics(tmp_path)
    assert (first["step"], first["loss"], first["loss_mean"]) == (3, 1.0, pytest.approx((3.0 + 2.5 + 1.0) / 3))
    assert first["tokens_per_s"] == pytest.approx(3 * 1024 / 1.5) and first["elapsed_s"] == 12.5
    assert first["time"] > 1.7e9 and "step_time_s" not in first
    assert (second["step"], second["loss"], second["loss_mean"], second["nonfinite"]) == (4, None, None, True)
