"""Every registered architecture (Transformer, Diff, Diff V2) trains through the real trainer and resumes exactly:
a run stopped by SIGTERM and relaunched logs the same losses, gradient norms and validation losses, bit for bit, as
the uninterrupted run of the same architecture."""

from __future__ import annotations

import signal

import pytest

from diffllm.model import variants
from diffllm.runs import read_metrics
from tests.distributed import launch_train, run_train
from tests.train.helpers import comparable, tiny

pytestmark = pytest.mark.slow
STEPS = 8


@pytest.mark.parametrize("arch", list(variants()))
def test_each_arch_resumes_exactly_after_sigterm(tokenizer, tmp_path, arch):
    def args(run_dir):
        return tiny(
            run_dir,
            2,
            f"model={arch}-tiny",
            "model.d_model=64",
            "model.n_layers=2",
            f"trainer.tokens={STEPS * 1024}",
            "trainer.save_every_steps=0",
            "trainer.val_every=4",
        )

    ref = tmp_path / "ref"
    run_train(args(ref), 1, tmp_path / "logs-ref", launcher="plain")
    run_dir = tmp_path / "run"
    run = launch_train(args(run_dir), 1, tmp_path / "logs1", launcher="plain")
    run.wait_until(lambda: any(m.get("step", 0) >= 3 for m in read_metrics(run_dir)))
    run.send(signal.SIGTERM)
    assert run.wait(120) == [3], run.output(0)
    stopped = max(m["step"] for m in read_metrics(run_dir))
    assert stopped < STEPS
    run_train(args(run_dir), 1, tmp_path / "logs2", launcher="plain")
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(ref))
    assert read_metrics(run_dir)[-1]["step"] == STEPS
