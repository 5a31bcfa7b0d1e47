"""Step watchdog: a daemon thread that ends a training process which has stopped making progress.

A rank that waits forever outside a collective (a stuck DataLoader worker, a hung file system read, a deadlock) is
never reached by the process-group timeout, and it outlives its job. The loop calls `beat(phase)` each time it enters
a phase ("data", "forward/backward", "optimizer step", "validation", "checkpoint save", ...). When no beat comes for
`timeout_s` seconds (or the phase's own allowance), the watchdog writes one line

    [diffllm.train] error: no progress for 912 s in data (rank 1; limit 900 s, trainer.stall_timeout_s) ...

then every thread's stack (faulthandler) to stderr, and ends the process with exit code STALL_EXIT_CODE (5), so that
torchrun / Slurm / the launcher see a failed rank, stop the others, and can restart the job from its last checkpoint.
The exit is immediate (os._exit: the stuck thread cannot run atexit handlers); first, the process ends everything it
started (its DataLoader forkserver and workers; its resource tracker cleans up, leaves): data.workers.end_children."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Callable, Optional

from ..data.workers import end_children  # imported now: the stuck thread may hold the import lock at exit

STALL_EXIT_CODE = 5  # distinct from 1 (an error raised) and 3 (stopped by SIGTERM after saving)


class Watchdog:
    """`Watchdog(timeout_s, rank).start()`; `beat(phase)` on progress; `stop()` at the end. timeout_s <= 0 disables it.
    `on_stall(phase, seconds)` replaces the default action (report and exit) - for embedding, not for the trainer."""

    def __init__(
        self,
        timeout_s: float,
        rank: int = 0,
        on_stall: Optional[Callable[[str, float], None]] = None,
        key: str = "trainer.stall_timeout_s",
    ):
        self.timeout_s, self.rank, self.key = float(timeout_s), rank, key
        self.on_stall = on_stall or self._report_and_exit
        self._lock = threading.Lock()
        self._phase, self._last, self._allow = "start-up", time.monotonic(), self.timeout_s
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    def start(self) -> Watchdog:
        if self.enabled and self._thread is None:
            self._last = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="diffllm-watchdog", daemon=True)
            self._thread.start()
        return self

    def beat(self, phase: str, allow_s: Optional[float] = None) -> None:
        """Progress: the loop now enters `phase`, which may take up to allow_s seconds (default: timeout_s)."""
        with self._lock:
            self._phase, self._last = phase, time.monotonic()
            self._allow = self.timeout_s if allow_s is None else max(float(allow_s), self.timeout_s)

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _watch(self) -> None:
        poll = min(5.0, max(0.05, self.timeout_s / 20))
        while not self._done.wait(poll):
            with self._lock:
                phase, idle, allow = self._phase, time.monotonic() - self._last, self._allow
            if idle > allow:
                self.on_stall(phase, idle)
                return

    def _report_and_exit(self, phase: str, idle: float) -> None:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - a broken stdout must not stop the exit
            pass
        err = sys.__stderr__
        err.write(
            f"[diffllm.train] error: no progress for {idle:.0f} s in {phase} (rank {self.rank}; limit "
            f"{self._allow:g} s, {self.key}); stacks of all threads follow; exiting with code {STALL_EXIT_CODE} "
            "so the launcher stops the job and can restart it from the last checkpoint\n"
        )
        err.flush()
        try:
            faulthandler.dump_traceback(file=err, all_threads=True)
        except (ValueError, OSError, AttributeError):  # no usable file descriptor behind stderr
            faulthandler.dump_traceback(file=2, all_threads=True)
        err.flush()
        end_children()
        os._exit(STALL_EXIT_CODE)
