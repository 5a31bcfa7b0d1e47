"""How DataLoader worker processes start and stop: forked from a forkserver (never from the threaded trainer), with
SIGTERM/SIGINT left to the trainer, and killed outright if they do not leave when asked.

Why not plain fork: by the time the first batch is asked for, the training process runs threads (gloo, DeepSpeed,
W&B, tokenizer pools). os.fork() copies a process whose other threads may hold interpreter or library locks, and the
child can deadlock before it runs a line (seen: a worker stuck in PyOS_AfterFork_Child, its rank waiting forever for
a batch). A forkserver is a fresh single-threaded interpreter started once per training process (fork + exec); it
imports the data stack once (this module and the one that runs in the workers, named by the caller, are its
preload), and every worker is forked from it, so a worker starts in
milliseconds after the first and never inherits a thread. Nothing outlives the training process, however it ends
(a watchdog's os._exit, SIGKILL): the kernel kills the forkserver when the training process ends and each worker
when its forkserver does (die_with_parent, requested by the forkserver itself first thing, and by each worker right
after its fork, before it unpickles anything: a worker still starting when its forkserver died used to live on,
re-parented, holding the resource tracker's pipe, so that one lived on too). DataLoader's own parent watchdog cannot
do this: a worker's parent is the forkserver, not the trainer (seen: forkservers and workers of a stalled rank still
alive an hour later). A training process that ends by os._exit first ends every process below it (end_children),
so that nothing is left even for a moment, and its resource tracker unlinks the shared-memory semaphores."""

from __future__ import annotations

import ctypes
import importlib.util
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing import resource_tracker

START_METHOD = "forkserver"
_FORKSERVER_OF = "DIFFLLM_DATA_FORKSERVER_OF"  # pid of the training process whose forkserver may ignore SIGTERM


def ignore_stop_signals(_: object = None) -> None:
    """Leave SIGTERM/SIGINT to the training process (which saves, then exits and takes its workers along), so that a
    signal sent to every process of a job (Slurm, Ctrl-C) cannot kill a worker under a trainer finishing its step."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def die_with_parent(parent: int | None = None) -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent ends (prctl PR_SET_PDEATHSIG); if the parent
    (pid `parent`, default: the current one) is already gone, leave now: the request only covers a parent alive when
    it is made, and a loaded machine can start a child after its parent has died. No thread is involved, so the
    forkserver stays safe to fork from. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect (we were re-parented)
        os._exit(0)


def worker_init(_: object = None) -> None:
    """DataLoader worker_init_fn: stop signals are the trainer's (the worker already dies with its forkserver: the
    forkserver's at-fork hook asked for that before the worker ran a line, see `_preload`)."""
    ignore_stop_signals()


def context(preload: tuple[str, ...] = ()) -> multiprocessing.context.BaseContext:
    """The multiprocessing context for DataLoader workers: a forkserver that imports this module (first: see
    `_preload`), then the modules named in `preload` (what the workers run, e.g. diffllm.data.loader)."""
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload([__name__, *preload])
    os.environ[_FORKSERVER_OF] = str(os.getpid())  # only the forkserver's environment keeps it
    try:
        forkserver.ensure_running()  # a no-op once started: one forkserver per training process
    finally:
        del os.environ[_FORKSERVER_OF]
    return ctx


def as_is(item: object) -> object:
    """DataLoader collate_fn: pass what a worker yields unchanged (numpy batches stay numpy). Torch tensors from a
    worker travel as shared-memory file descriptors that the receiver must fetch from the worker itself, so a stuck
    worker would hang the training process inside that fetch, where no timeout reaches; numpy arrays are pickled by
    value through the queue (a few KB per micro-batch) and the DataLoader timeout holds."""
    return item


def stop(workers: list) -> None:
    """SIGKILL the workers that are still alive after DataLoader's own shutdown (which sends SIGTERM, ignored here):
    a worker blocked in a read that never returns must not outlive its loader."""
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join(timeout=5)


def _preload(trainer: int) -> None:
    """Runs when the forkserver imports this module: end with the training process (pid `trainer`; first, so that
    one dying during the imports leaves nothing behind), ignore stop signals, load what every worker needs (the
    forkserver then imports the caller's modules: `context(preload)`)."""
    die_with_parent(trainer)
    forkserver = os.getpid()
    os.register_at_fork(after_in_child=lambda: die_with_parent(forkserver))  # each worker, before it runs a line
    ignore_stop_signals()
    if importlib.util.find_spec("datasets") is not None:  # hub sources read through it; prepared shards need none
        import datasets  # noqa: F401 - about 2 s, paid once per training process instead of once per worker
    import torch.utils.data  # noqa: F401


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (Linux: a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        return True


def end_children(wait_s: float = 30.0) -> None:
    """Before this process ends by os._exit (no atexit handler, no finalizer runs): SIGKILL every process below it
    (its forkserver, DataLoader workers, anything else it started), frozen first (SIGSTOP) so that none can fork a
    new one unseen, and wait for them to end (up to wait_s: a loaded machine can take seconds); then let its resource
    tracker go (close our end of its pipe: it unlinks the semaphores left in /dev/shm and leaves), killed too if it has
    not left within wait_s. Linux (/proc); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    tracker = resource_tracker._resource_tracker
    tracker_pid = getattr(tracker, "_pid", None)
    frozen: list[int] = []
    while found := [p for p in _descendants(os.getpid()) if p != tracker_pid and p not in frozen]:
        frozen += found
        _signal(found, signal.SIGSTOP)
    _signal(frozen, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while (alive := [p for p in frozen if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    if alive:
        sys.stderr.write(f"[diffllm] warning: processes {alive} still ending {wait_s:g} s after SIGKILL\n")
    if tracker_pid is not None and getattr(tracker, "_fd", None) is not None:
        try:
            os.close(tracker._fd)  # the last writer gone: the tracker cleans up and exits
        except OSError:
            pass
        while not _reaped(tracker_pid) and time.monotonic() < deadline + wait_s:
            time.sleep(0.01)
        if not _reaped(tracker_pid):
            _signal([tracker_pid], signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """Live processes below `root` (children, their children, ...), read from /proc; zombies left out."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state not in ("Z", "X"):
            children.setdefault(int(ppid), []).append(int(name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # already gone
            pass


def _reaped(child: int) -> bool:
    """Whether our child process `child` has ended (and reap it)."""
    try:
        return os.waitpid(child, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _forkserver_of() -> int | None:
    """In the forkserver (whose environment alone has the variable, set to its training process's pid): that pid,
    also when the training process has already ended (the forkserver then leaves at once); elsewhere None."""
    pid = os.environ.get(_FORKSERVER_OF, "")
    if not pid.isdigit():
        return None
    return int(pid) if os.getppid() == int(pid) or not _alive(int(pid)) else None


if (_trainer := _forkserver_of()) is not None:
    _preload(_trainer)
