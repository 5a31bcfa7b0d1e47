"""A rank takes its processes with it: when a training process ends by its step watchdog or is killed outright
(SIGKILL stands for any end that runs no cleanup of ours: the OOM killer, a launcher's kill), no DataLoader
forkserver, worker or resource tracker of it lives on. Leftovers are found by process, not by log file: every process
the rank starts inherits a marker in its environment, and a re-parented orphan still carries it.

The fault, explicit and free of timing: a DataLoader worker still starting when its training process ends, as on a
loaded machine. A sitecustomize.py on the rank's PYTHONPATH holds each process that a multiprocessing forkserver
forks (a worker), right after its fork, until that forkserver has ended. Before the fix such a worker carried on,
re-parented, asked for the parent-death signal relative to its new parent, and lived on - and the resource tracker,
whose pipe it held, with it; both ignore SIGTERM (issue 31: seen 19 minutes after a stalled-rank test; a worker's
command line is its forkserver's). Measured before the fix: after a watchdog exit both were still there 35 s later."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.distributed import REPO, base_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal and /proc")

HOLD_WORKERS = """
# tests/train/test_orphans.py's fault: a process forked by a multiprocessing forkserver (a DataLoader worker) waits,
# before it runs a line of its own, until its forkserver has ended
import os, time

if b"multiprocessing.forkserver" in open("/proc/self/cmdline", "rb").read():
    _server = os.getpid()

    def _hold():
        while os.getppid() == _server:
            time.sleep(0.01)

    os.register_at_fork(after_in_child=_hold)
"""

RANK = """
import os, signal, sys, threading
from pathlib import Path
from diffllm.data import build_train_loader
from diffllm.train.watchdog import Watchdog
from tests.data.conftest import tok_for_tests
from tests.data.helpers import cfg, make_docs, write_jsonl

if __name__ == "__main__":
    path = write_jsonl(Path(sys.argv[1]) / "a.jsonl", make_docs("d", 50, seed=0))
    loader = build_train_loader(cfg([{"path": str(path)}], num_workers=1), tok_for_tests(), 0, 1, 1)
    loader._it = loader._start()  # what the first batch does: its worker is forked (and held)
    if sys.argv[2] == "watchdog":
        Watchdog(0.2).start()  # the batch never comes: the watchdog ends the process (exit code 5)
        threading.Event().wait()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def marked(marker: str) -> list[str]:
    """Live (not zombie) processes whose environment holds `marker`, as 'pid (state, parent) cmdline'."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if state in ("Z", "X"):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid} (state {state}, parent {ppid}) {cmdline[:150]}")
        except OSError:  # ended meanwhile, or not ours
            pass
    return found


def run_rank(tmp_path, end: str) -> tuple[int, str, str]:
    """The rank script, ended by `end` (watchdog | kill), with a held worker; returns (exit code, stderr, marker).
    Its output goes to a file: a pipe would stay open as long as a leftover holds it."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HOLD_WORKERS)
    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    marker = f"diffllm-orphan-test-{uuid.uuid4().hex}"
    env = base_env({"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}", "DIFFLLM_TEST_MARKER": marker})
    cmd = [sys.executable, str(tmp_path / "rank.py"), str(tmp_path), end]
    try:
        with open(tmp_path / "rank.err", "w") as err:
            code = subprocess.run(cmd, cwd=REPO, env=env, stderr=err, timeout=180).returncode
        return code, (tmp_path / "rank.err").read_text(), marker
    finally:  # whatever the test finds, nothing of it outlives the test
        for line in marked(marker):
            os.kill(int(line.split()[0]), 9)


def test_a_rank_ended_by_its_watchdog_leaves_no_process(tmp_path):
    """The watchdog first ends every process below its rank, so that when the rank's exit code is known none of them
    is left, not even for a moment; the resource tracker has cleaned up and left by itself."""
    code, err, marker = run_rank(tmp_path, "watchdog")
    left = marked(marker)
    assert code == 5 and "error: no progress for" in err, err[-3000:]
    assert not left, f"processes left behind:\n{left}"


@pytest.mark.slow  # a guard, not a reproduction: it passed before the fix too (the held worker left by itself)
def test_a_killed_rank_leaves_no_process(tmp_path):
    """SIGKILL: the kernel ends the forkserver, its worker (it asked for the parent-death signal at its fork, and
    leaves if its forkserver is already gone), and so the resource tracker (the last writer to its pipe gone)."""
    code, err, marker = run_rank(tmp_path, "kill")
    assert code == -9, err[-3000:]
    deadline = time.monotonic() + 30  # signals and exits in flight: moments, not more; before the fix, forever
    while (left := marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind:\n{left}"
