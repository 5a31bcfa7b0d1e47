"""Preemption: SIGTERM/SIGINT/SIGUSR1 (what SLURM and Ctrl-C send) only raise a flag; the loop finishes its step,
saves a checkpoint and exits with EXIT_PREEMPTED. A second Ctrl-C stops at once. The launcher's death is no signal to
wait for: a rank started by one dies with it (diffllm/lifeline.py, tied when the flag is installed)."""

from __future__ import annotations

import os
import signal
from typing import Optional

from ..lifeline import tie_rank

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopFlag:
    def __init__(self) -> None:
        self.received: Optional[str] = None
        self._previous: dict = {}

    def install(self) -> StopFlag:
        tie_rank()  # kill -9 of torchrun or `diffllm launch` leaves no rank training on
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait for the save
        if self.received is not None:
            return  # said once: SLURM and torchrun may deliver the same stop more than once
        self.received = name
        if os.environ.get("RANK", "0") != "0":
            return  # rank 0 speaks for the job
        # os.write, not print: a handler may interrupt a print, and print is not reentrant
        try:
            os.write(
                2,
                f"\n[diffllm.train] {name} received: finishing this step, saving a checkpoint, then exiting\n".encode(),
            )
        except OSError:  # stderr closed (a killed pipe): the save matters more than the message
            pass
