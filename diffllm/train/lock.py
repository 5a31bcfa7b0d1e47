"""The trainer's hold on its run directory (diffllm/runlock.py): taken by rank 0 before the run's first write, the
verdict shared by every rank (a refused job exits 2 on all of them, in one line naming the job that holds it), the
heartbeat a daemon thread of rank 0, and a job that finds its lock taken over (its heartbeat stalled past STALE_S
and another job judged it dead) stops at once, without saving: exit code EXIT_LOCK_LOST."""

from __future__ import annotations

import os
import sys
from typing import Optional

from ..errors import UserError
from ..runlock import STALE_S, RunLock, describe
from ..runs import Run
from .dist import all_gather_object

EXIT_LOCK_LOST = 8  # another job took over this run directory's lock: this one stops at once (nothing saved)


def hold_run_dir(run: Run, rank: int, take: bool = True) -> Optional[RunLock]:
    """Collective. `take`: rank 0 takes run_dir's lock and starts its heartbeat (the lock is returned on rank 0; None
    elsewhere, and for a run directory this job cannot write to). Not `take` (a job that writes nothing): only
    refused if a live job holds it. A refusal is raised on every rank alike."""
    lock, refusal = None, None
    if rank == 0:
        try:
            if take:
                lock = RunLock.take(run.dir, say=lambda msg: print(f"[diffllm.train] {msg}", flush=True))
            else:
                RunLock.check_free(run.dir)
        except UserError as e:
            refusal = str(e)
        except OSError as e:  # e.g. a full disk as the lock file is written
            refusal = f"run_dir={run.dir}: cannot write its lock file ({e.strerror}: {e.filename})"
    refusal = all_gather_object(refusal)[0]
    if refusal is not None:
        raise UserError(refusal)
    return lock.start(on_lost=stop_now) if lock is not None else None


def stop_now(lock: RunLock, holder: dict) -> None:
    """The heartbeat found another job's lock: that job judged this one dead (no heartbeat for STALE_S) and now writes
    the run; this one stops at once, saving nothing, so that one job writes it."""
    from ..data.workers import end_children

    sys.__stderr__.write(
        f"[diffllm.train] error: {lock.path} now names another job ({describe(holder)}), which took the run directory "
        f"over after this job's heartbeat stalled for more than {STALE_S:.0f} s; this job stops at once without "
        f"saving (exit code {EXIT_LOCK_LOST}), leaving the run to that job\n"
    )
    sys.__stderr__.flush()
    end_children()
    os._exit(EXIT_LOCK_LOST)
