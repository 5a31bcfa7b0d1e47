"""One job per run directory: run_dir/lock.json names the job that writes the run, and a second job is refused.

The lock file holds its holder (host, PID, since when, its SLURM job) and a random token. It is published atomically
(written aside, then hard-linked to lock.json, which fails if the name exists: safe on NFS and Lustre; O_EXCL where a
file system has no hard links), so of two jobs starting together exactly one gets it. The holder touches it every
HEARTBEAT_S (a daemon thread: no RNG draw, no collective; a file's mtime is the file server's clock) and removes it at
its end. A job that finds the lock held decides whether its holder lives:

- on the same machine (host, boot and PID namespace alike) by its PID and the process's start time: a crashed or
  killed job is taken over at once, a live one refuses the newcomer, whatever its heartbeat;
- a requeue of the same SLURM job (same SLURM_JOB_ID, a higher SLURM_RESTART_COUNT) takes over at once: SLURM starts
  it only after the old run of the job has ended;
- otherwise (another host: its PIDs mean nothing here) by the heartbeat: a lock not touched for STALE_S is a dead
  job's. Until then the newcomer is refused, in one line that says when the lock lapses.

A lock copied with its run directory (cp -r of a running run) names another folder (its inode) and does not count.
Taking over renames the stale file aside and checks that it was the one judged stale (two newcomers at once: one wins,
the other sees the winner's lock and is refused). A holder whose heartbeat finds another job's token in lock.json
(its own heartbeat stalled past STALE_S and a newcomer took over) has lost the run directory: `RunLock.start`'s
`on_lost` decides what to do (the trainer stops at once, diffllm/train/lock.py). Light: no torch."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from .errors import UserError
from .lifeline import boot_id, process_start

LOCK_FILE = "lock.json"
HEARTBEAT_S = 15.0  # how often the holder touches lock.json
STALE_S = 120.0  # a lock not touched for this long, held from a machine we cannot look at, is a dead job's
OWN = "this process's own lock"
_HELD: dict[str, RunLock] = {}  # the locks this process holds, by path (a second take in one process replaces one)


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def me(run_dir: Path) -> dict:
    """This process as a lock holder: what another job needs to judge whether it still runs, and to name it."""
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": now,
        "since_text": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
        "boot_id": boot_id(),
        "pid_ns": _pid_ns(),
        "start": process_start(os.getpid()),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        "dir_ino": run_dir.stat().st_ino,
        "token": uuid.uuid4().hex,
    }


def describe(holder: dict) -> str:
    """`host h1, pid 4242, since 2026-12-07 01:40:12 UTC (SLURM job 77)`."""
    slurm = f" (SLURM job {holder['slurm_job_id']})" if holder.get("slurm_job_id") else ""
    return f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since_text')}{slurm}"


def same_machine(a: dict, b: dict) -> bool:
    """Whether PIDs of `a` can be looked up by `b`: one host, one boot, one PID namespace."""
    keys = ("host", "boot_id", "pid_ns")
    return all(a.get(k) for k in keys) and all(a.get(k) == b.get(k) for k in keys)


def judge(holder: dict, mine: dict, age_s: float) -> Optional[str]:
    """Why the lock of `holder`, last touched `age_s` ago, is no live job's (taken over), or None: it is one's."""
    if holder.get("token") is None:  # cut short by a crash as it was written (O_EXCL): its age alone tells
        return f"an unreadable lock not touched for {age_s:.0f} s" if age_s > STALE_S else None
    if holder.get("dir_ino") != mine["dir_ino"]:
        return "its lock was copied from another run directory"
    if same_machine(holder, mine):
        if holder.get("pid") == mine["pid"]:
            return OWN
        pid = holder.get("pid")
        if not isinstance(pid, int) or process_start(pid) != holder.get("start"):
            return "its process has ended"
        return None
    job, restarts = holder.get("slurm_job_id"), int(holder.get("slurm_restart_count") or 0)
    if job and job == mine["slurm_job_id"] and mine["slurm_restart_count"] > restarts:
        return f"this is a requeue of its SLURM job {job} (restart {mine['slurm_restart_count']} > {restarts})"
    if age_s > STALE_S:
        return f"no heartbeat for {age_s:.0f} s (> {STALE_S:.0f} s)"
    return None


def busy(run_dir: Path, holder: dict, age_s: float, mine: dict) -> UserError:
    """The refusal: one line naming the job that holds `run_dir`."""
    lapse = f" (if it has died, its lock lapses {STALE_S:.0f} s after its last touch)"
    lapse = "" if same_machine(holder, mine) else lapse
    return UserError(
        f"run_dir={run_dir} is in use by another job ({describe(holder)}; its {LOCK_FILE} touched {age_s:.0f} s ago): "
        f"two jobs would interleave their checkpoints and metrics; wait for it to end or stop it{lapse}, or use "
        f"another run_dir"
    )


def _open_holder(path: Path) -> Optional[tuple[dict, float]]:
    """(the holder's record, seconds since the lock was last touched), None when there is no lock file. Opened,
    then stat'ed through the open file: NFS revalidates a file's attributes at open (close-to-open), a path's may be
    a minute old."""
    try:
        with open(path) as f:
            text, mtime = f.read(), os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
        assert isinstance(holder, dict) and "token" in holder
    except (ValueError, AssertionError):  # cut short by a crash mid-write (the O_EXCL path): its age decides
        holder = {"token": None, "host": "?", "pid": "?", "since_text": "?"}
    return holder, max(0.0, time.time() - mtime)


def _publish(path: Path, record: dict) -> bool:
    """Create `path` holding `record` unless it exists: True if created. Written aside, then hard-linked (atomic,
    also on NFS); a file system without hard links gets an O_EXCL create."""
    text = json.dumps(record, indent=1) + "\n"
    tmp = path.with_name(f".{path.name}.{record['token']}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            if tmp.stat().st_nlink == 2:  # NFS: the link was made, its reply lost
                return True
            raise
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return True


def _break(path: Path, holder: dict) -> bool:
    """Remove the stale lock of `holder`: True if the file removed was that one. It is renamed aside first (one
    rename of a name succeeds); a lock another newcomer published meanwhile is put back."""
    aside = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True  # gone already: try to take it
    taken = _open_holder(aside)
    if taken is not None and taken[0].get("token") != holder.get("token"):
        try:
            os.link(aside, path)  # a fresh lock: not ours to remove
        except OSError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True


class RunLock:
    """The lock of one run directory held by this process: `RunLock.take(run_dir)`, `start()`, `release()`."""

    def __init__(self, path: Path, record: dict, created: list[Path]):
        self.path, self.record, self.created = path, record, created  # created: the folders taking it made
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost = False

    @classmethod
    def take(cls, run_dir: Path, say: Callable[[str], None] = print) -> Optional[RunLock]:
        """The lock of `run_dir` (created with its parents if missing), or a one-line UserError naming the live job
        that holds it. None for a run directory this process cannot write to (it writes nothing there)."""
        run_dir = Path(run_dir)
        created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # deepest first
        if created:
            run_dir.mkdir(parents=True, exist_ok=True)
        elif not os.access(run_dir, os.W_OK | os.X_OK):
            return None
        path = run_dir / LOCK_FILE
        mine = me(run_dir)
        for _ in range(5):
            if _publish(path, mine):
                lock = cls(path, mine, created)
                _HELD[str(path)] = lock
                return lock
            found = _open_holder(path)
            if found is None:
                continue  # released meanwhile
            holder, age = found
            why = judge(holder, mine, age)
            if why is None:
                cls._undo(created)
                raise busy(run_dir, holder, age, mine)
            if why == OWN and str(path) in _HELD:
                _HELD.pop(str(path)).stop()
            if _break(path, holder):
                say(f"{path}: taking over the lock of {describe(holder)}: {why}")
        cls._undo(created)
        raise UserError(f"run_dir={run_dir}: could not take {LOCK_FILE}: other jobs keep taking it; start one job")

    @staticmethod
    def check_free(run_dir: Path) -> None:
        """Reads only: a one-line UserError if a live job holds `run_dir`'s lock (a job that only reads the run, as a
        relaunch of a finished one, must not run beside one that writes it)."""
        path = Path(run_dir) / LOCK_FILE
        found = _open_holder(path) if path.exists() else None
        if found is not None:
            holder, age = found
            mine = me(Path(run_dir))
            if judge(holder, mine, age) is None:
                raise busy(Path(run_dir), holder, age, mine)

    def beat(self) -> bool:
        """Touch the lock; False once another job's token is in it (this job has lost the run directory). A lock
        file deleted by hand is put back."""
        found = _open_holder(self.path)
        if found is None and _publish(self.path, self.record):
            return True
        found = found or _open_holder(self.path)
        if found is None or found[0].get("token") != self.record["token"]:
            return False
        try:
            os.utime(self.path)
        except OSError:  # a file server hiccup: the next beat tries again
            pass
        return True

    def start(self, on_lost: Callable[[RunLock, dict], None]) -> RunLock:
        """The heartbeat: a daemon thread that beats every HEARTBEAT_S until `release`; `on_lost(lock, holder)` when
        another job holds the lock."""
        self._thread = threading.Thread(target=self._run, args=(on_lost,), name="diffllm-run-lock", daemon=True)
        self._thread.start()
        return self

    def _run(self, on_lost: Callable[[RunLock, dict], None]) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                alive = self.beat()
            except Exception:  # noqa: BLE001 - the heartbeat must never end the job by accident
                continue
            if not alive and not self._stop.is_set():
                self.lost = True
                on_lost(self, (_open_holder(self.path) or ({},))[0])
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this job's (and the run directory, if taking the
        lock created it and nothing was written there since)."""
        self.stop()
        _HELD.pop(str(self.path), None)
        found = _open_holder(self.path)
        if found is not None and found[0].get("token") == self.record["token"]:
            self.path.unlink(missing_ok=True)
        self._undo(self.created)

    @staticmethod
    def _undo(created: list[Path]) -> None:
        """Remove the folders that taking the lock created, deepest first, while they are empty: a job refused, or
        stopped by bad input before it wrote anything, leaves no empty run_dir behind."""
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                return
