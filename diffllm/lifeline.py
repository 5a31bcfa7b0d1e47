"""Processes end with the one that started them: a launcher with `diffllm launch`, a rank with its launcher.

kill -9 of `diffllm launch` or of torchrun runs no cleanup of theirs. Without these ties torchrun and its ranks train
on, re-parented to init, and the same command run again (as after a preemption) starts a second job on the same run
directory. Linux (prctl, /proc, pidfd); no-ops elsewhere:

- `diffllm launch` starts its launcher (torchrun, DeepSpeed's runner) with the parent-death signal (SIGKILL) asked
  for in the child before it execs (`preexec`): the launcher dies with it;
- a rank started by a launcher (torchrun: TORCHELASTIC_RUN_ID; DeepSpeed's: CROSS_RANK; `diffllm launch`:
  LAUNCHER_ENV) asks for the same on its own parent (`tie_rank`, called as the trainer starts);
- under `diffllm launch` a rank also watches that process itself (LAUNCHER_ENV names it: host, boot, pid, start time;
  a daemon thread waits on its pidfd). This covers DeepSpeed's runner, whose per-node `launch` process sits between
  them, and a launcher killed while the rank was still importing (before it could ask for the parent-death signal).

A rank so ended is SIGKILLed; its DataLoader forkserver and workers follow by their own tie (diffllm/data/workers.py).
A plain `diffllm train` (no launcher) is tied to nothing: `nohup diffllm train ... &` outlives its shell."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Callable, Optional

LAUNCHER_ENV = "DIFFLLM_LAUNCHER"  # set by `diffllm launch` for its ranks: host:boot_id:pid:start of itself
LAUNCHED_BY = ("TORCHELASTIC_RUN_ID", "CROSS_RANK", LAUNCHER_ENV)  # torchrun's, DeepSpeed's launch.py's, ours
_PR_SET_PDEATHSIG = 1
_LINUX = sys.platform.startswith("linux")
_TIED = False  # tie_rank has run in this process (once is enough: the entry point may call it before the trainer)


def process_start(pid: int) -> Optional[str]:
    """When process `pid` started (clock ticks since boot: /proc/<pid>/stat field 22), None if it has ended (a zombie
    too). With the pid it names one process, whatever later reuses the number."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def identity() -> str:
    """This process, as LAUNCHER_ENV names it: `host:boot_id:pid:start`."""
    return f"{socket.gethostname()}:{boot_id()}:{os.getpid()}:{process_start(os.getpid())}"


def _prctl() -> Optional[Callable[..., int]]:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def preexec() -> Optional[Callable[[], None]]:
    """Popen's preexec_fn for a child that must die with this process (None off Linux). Resolved here, in the parent:
    between fork and exec the child only calls prctl, then leaves if this process has already ended."""
    prctl = _prctl() if _LINUX else None
    if prctl is None:
        return None
    parent = os.getpid()

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # ended before the request took effect: the child is an orphan already
            os._exit(1)

    return tie


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def tie_rank() -> None:
    """In a rank started by a launcher (LAUNCHED_BY): die with the parent (SIGKILL when it ends; at once if it has
    ended: re-parented to init), and under `diffllm launch`, with that process too (a daemon thread)."""
    global _TIED
    if _TIED or not _LINUX or not any(os.environ.get(k) for k in LAUNCHED_BY):
        return
    _TIED = True
    prctl = _prctl()
    if prctl is not None:  # (an orphan already is not told by its parent's pid: torchrun may be a container's pid 1)
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    host, boot, pid, start = (os.environ.get(LAUNCHER_ENV, "").split(":") + ["", "", "", ""])[:4]
    if host == socket.gethostname() and boot == boot_id() and pid.isdigit():  # its pids mean something here
        if process_start(int(pid)) != start:
            _die()
        threading.Thread(target=_watch, args=(int(pid), start), name="diffllm-lifeline", daemon=True).start()


def _watch(pid: int, start: str) -> None:
    """Until process `pid` (started at `start`) ends, then SIGKILL this one: its pidfd becomes readable when it ends;
    without pidfd (Linux < 5.3), /proc is looked at every second."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    if process_start(pid) == start:  # the pidfd is of that very process (not a later one with its number)
        if fd is not None:
            select.select([fd], [], [])
        else:
            while process_start(pid) == start:
                time.sleep(1.0)
    _die()
