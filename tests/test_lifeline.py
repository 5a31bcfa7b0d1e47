"""diffllm/lifeline.py with real processes: a launcher dies with `diffllm launch`, a rank with its launcher (and, under
`diffllm launch`, with that process even through a launcher in between that lives on), a rank whose launcher is gone
before it could tie itself leaves at once, and a plain process is tied to nothing. Each process is a few lines of
Python in the place of `diffllm launch`, torchrun or a rank; SIGKILL stands for any end that runs no cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from diffllm.lifeline import LAUNCHER_ENV, process_start
from tests.distributed import REPO, base_env
from tests.train.test_orphans import marked

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl, /proc and pidfd are Linux's")

CHAIN = """
import os, subprocess, sys, time
from diffllm.lifeline import LAUNCHER_ENV, identity, preexec, tie_rank

role, rest = sys.argv[1], sys.argv[2:]


def start(args, env=None, tie=False):
    return subprocess.Popen([sys.executable, __file__, *args], env=env, preexec_fn=preexec() if tie else None)


if role == "launch":  # `diffllm launch`: names itself to the ranks, starts its launcher tied (or not) to itself
    start(rest[1:], dict(os.environ, **{LAUNCHER_ENV: identity()}), tie=rest[0] == "tied")
elif role == "torchrun":  # a launcher: starts the rank with its own marker
    start(rest, dict(os.environ, TORCHELASTIC_RUN_ID="test"))
elif role == "middle":  # a launcher between them that is tied to nothing (DeepSpeed's per-node launch.py)
    start(rest)
elif role == "rank":  # the trainer: ties itself as it starts
    tie_rank()
print(role, os.getpid(), flush=True)
time.sleep(600)
"""


class Chain:
    """`python chain.py <roles...>`: each process starts the next; every one prints `<role> <pid>`."""

    def __init__(self, tmp_path, *roles: str, env: dict | None = None):
        (tmp_path / "chain.py").write_text(CHAIN)
        self.marker = f"diffllm-lifeline-test-{uuid.uuid4().hex}"
        env = base_env({"PYTHONPATH": str(REPO), "DIFFLLM_TEST_MARKER": self.marker, **(env or {})})
        for k in ("TORCHELASTIC_RUN_ID", "CROSS_RANK", LAUNCHER_ENV):
            env.pop(k, None)
        args = [sys.executable, str(tmp_path / "chain.py"), *roles]
        self.top = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        self.pids = {}
        while "rank" not in self.pids:
            line = self.top.stdout.readline()
            assert line, "the chain ended before its rank started"
            role, pid = line.split()
            self.pids[role] = int(pid)

    def kill(self, role: str) -> None:
        os.kill(self.pids[role], signal.SIGKILL)
        if role == self.top_role:
            self.top.wait()

    @property
    def top_role(self) -> str:
        return next(iter(self.pids))

    def untouched(self, role: str) -> bool:
        """Whether process `role` runs and no SIGKILL awaits it. The parent-death signal is sent as the parent ends,
        before the parent can be reaped: once it has been, a tied child is gone or has SIGKILL pending."""
        try:
            with open(f"/proc/{self.pids[role]}/status") as f:
                status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
        except FileNotFoundError:
            return False
        pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
        return status["State"][0] not in "ZX" and not pending & (1 << (signal.SIGKILL - 1))

    def gone(self, role: str, timeout: float = 30) -> bool:
        """Whether process `role` has ended (a zombie awaiting its new parent's reaping counts as ended)."""
        deadline = time.monotonic() + timeout  # a signal in flight on a loaded machine: moments, never more
        while process_start(self.pids[role]) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return process_start(self.pids[role]) is None

    def close(self) -> None:
        for line in marked(self.marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)
        self.top.kill()
        self.top.wait()


@pytest.fixture
def chain(tmp_path):
    made = []

    def make(*roles, env=None):
        folder = tmp_path / str(len(made))
        folder.mkdir()
        made.append(Chain(folder, *roles, env=env))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_the_launcher_started_by_diffllm_launch_dies_with_it_and_its_rank_with_the_launcher(chain):
    c = chain("launch", "tied", "torchrun", "rank")
    c.kill("launch")
    assert c.gone("torchrun") and c.gone("rank"), marked(c.marker)


def test_a_rank_under_diffllm_launch_dies_with_it_through_a_launcher_in_between_that_lives_on(chain):
    c = chain("launch", "untied", "middle", "rank")
    c.kill("launch")
    assert c.gone("rank"), marked(c.marker)
    assert c.untouched("middle")  # tied to nothing: the rank's own watch on `diffllm launch` ended the rank


def test_a_rank_dies_with_its_launcher(chain):
    c = chain("torchrun", "rank")
    c.kill("torchrun")
    assert c.gone("rank"), marked(c.marker)


def test_a_plain_process_is_tied_to_nothing(chain):
    """`nohup diffllm train ... &` outlives its shell: a process no launcher started keeps running."""
    c = chain("middle", "rank")
    c.kill("middle")
    assert c.untouched("rank")


def test_a_rank_whose_launcher_is_gone_before_it_tied_itself_leaves_at_once(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{os.uname().nodename}:{open('/proc/sys/kernel/random/boot_id').read().strip()}:{ended.stdout.strip()}:1"
    code = "from diffllm.lifeline import tie_rank; tie_rank(); print('tied')"
    env = base_env({"PYTHONPATH": str(REPO), LAUNCHER_ENV: dead})
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL and done.stdout == "", done
    alive = dead.rsplit(":", 2)[0] + f":{os.getpid()}:{process_start(os.getpid())}"  # this test's process: alive
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, LAUNCHER_ENV: alive}, capture_output=True)
    assert done.returncode == 0 and done.stdout == b"tied\n", done
