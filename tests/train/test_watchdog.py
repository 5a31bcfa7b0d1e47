"""The step watchdog in real processes: a stalled one exits with STALL_EXIT_CODE, naming the phase and showing the
stuck thread's stack; one that keeps beating (or is given a longer allowance for a slow phase) runs to its end."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from diffllm.train.watchdog import STALL_EXIT_CODE, Watchdog
from tests.distributed import REPO, base_env

pytestmark = pytest.mark.slow


def run(body: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run `body` (which may use Watchdog, time and threading) in a fresh interpreter; (result, seconds)."""
    code = "import threading, time\nfrom diffllm.train.watchdog import Watchdog\n" + textwrap.dedent(body)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=timeout
    )
    return res, time.monotonic() - t0


def test_a_stalled_process_exits_with_the_stall_code_and_its_stacks():
    res, secs = run("""
        def wait_for_a_batch_that_never_comes():
            threading.Event().wait()

        dog = Watchdog(2, rank=1).start()
        dog.beat("forward/backward")
        dog.beat("data")
        wait_for_a_batch_that_never_comes()
    """)
    assert res.returncode == STALL_EXIT_CODE, res.stderr
    assert secs < 100
    first = res.stderr.splitlines()[0]
    assert first.startswith("[diffllm.train] error: no progress for ") and " s in data (rank 1; limit 2 s" in first
    assert "wait_for_a_batch_that_never_comes" in res.stderr  # the main thread's stack, where it is stuck
    assert "diffllm/train/watchdog.py" in res.stderr  # and the watchdog's own thread


def test_a_beating_process_runs_to_its_end():
    res, _ = run("""
        with Watchdog(3, rank=0) as dog:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                dog.beat("step")
                time.sleep(0.05)
            dog.beat("checkpoint save", allow_s=60)  # a slow phase gets its own allowance
            time.sleep(5)
        time.sleep(4)  # stopped: nothing watches any more
        print("finished")
    """)
    assert res.returncode == 0 and res.stdout.strip() == "finished" and not res.stderr, res.stderr


def test_disabled_and_custom_action():
    assert not Watchdog(0).start().enabled  # 0 = off: no thread
    stalls = []
    dog = Watchdog(0.2, rank=3, on_stall=lambda phase, idle: stalls.append((phase, idle))).start()
    dog.beat("validation")
    deadline = time.monotonic() + 60
    while not stalls and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert len(stalls) == 1 and stalls[0][0] == "validation" and stalls[0][1] > 0.2
