"""DataLoader worker processes: never forked from the (threaded) training process; a worker stuck in a read that never
returns turns into a one-line DataError after data.worker_timeout_s, is killed, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from diffllm.data import DataError, build_train_loader
from diffllm.data.workers import _alive
from tests.data.helpers import cfg, corpus, take
from tests.distributed import REPO, base_env


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_workers_are_not_forks_of_the_training_process(tmp_path, tok):
    """os.fork() of a process that runs threads (gloo, DeepSpeed, W&B) can deadlock the child before it runs a line;
    workers come from a single-threaded forkserver instead, which a second loader reuses."""
    corpus(tmp_path, n_files=2, docs_per_file=20)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], num_workers=2)
    first = build_train_loader(data, tok, 0, 1, 1)
    batches = take(first, 4)
    parents = {_ppid(w.pid) for w in first._it._workers}
    second = build_train_loader(data, tok, 0, 1, 1)
    assert all((a == b).all() for a, b in zip(take(second, 4), batches))
    assert os.getpid() not in parents and len(parents) == 1
    assert {_ppid(w.pid) for w in second._it._workers} == parents  # one forkserver per training process
    first.close()
    second.close()


@pytest.mark.slow
def test_a_stuck_worker_fails_in_time_and_leaves_no_process(tmp_path):
    """The worker is frozen (SIGSTOP, as a process stuck in an uninterruptible read): once the prefetched batches are
    used, the training process gets a DataError after worker_timeout_s, and it exits by itself, worker gone."""
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from diffllm.data import DataError, build_train_loader
        from tests.data.conftest import tok_for_tests
        from tests.data.helpers import cfg, make_docs, write_jsonl

        if __name__ == "__main__":
            path = write_jsonl(Path({str(tmp_path)!r}) / "a.jsonl", make_docs("d", 400, seed=0))
            loader = build_train_loader(cfg([{{"path": str(path)}}], num_workers=1, worker_timeout_s=3),
                                        tok_for_tests(), 0, 1, 1)
            next(loader)
            os.kill(loader._it._workers[0].pid, signal.SIGSTOP)
            try:
                for _ in range(1000):
                    next(loader)
            except DataError as e:
                print("DataError:", e, flush=True)
    """)
    (tmp_path / "stuck.py").write_text(script)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "stuck.py")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(base_env(), PYTHONPATH=str(REPO)),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        pytest.fail(f"the training process hung: {proc.communicate()}")
    assert proc.returncode == 0, err
    assert out.startswith(
        "DataError: data: no batch from this rank's DataLoader workers (rank 0) within 3 s (data.worker_timeout_s)"
    ), (out, err)
    assert time.monotonic() - t0 < 170
    left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:  # the forkserver leaves on its parent's exit, within moments
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"


def test_worker_timeout_is_checked():
    with pytest.raises(DataError, match=r"data.worker_timeout_s: must be >= 0 \(0 = wait forever\), got -1"):
        cfg([{"path": "x.jsonl"}], worker_timeout_s=-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_forkserver_whose_training_process_already_ended_leaves(tmp_path):
    """A loaded machine can start the forkserver's preload after its training process has died: it must leave then,
    not live on as an orphan (the kernel's parent-death signal only covers a parent alive when it is requested)."""
    out = tmp_path / "child.out"
    child = "import time; time.sleep(2); import diffllm.data.workers; print('survived', flush=True)"
    parent = textwrap.dedent(f"""
        import os, subprocess, sys
        env = dict(os.environ, DIFFLLM_DATA_FORKSERVER_OF=str(os.getpid()))
        p = subprocess.Popen([sys.executable, "-c", {child!r}], env=env, stdout=open({str(out)!r}, "w"))
        print(p.pid, flush=True)
    """)  # the "training process" ends at once (a zombie until run() returns); its "forkserver" imports 2 s later
    res = subprocess.run(
        [sys.executable, "-c", parent], env=base_env(), cwd=REPO, capture_output=True, text=True, check=True
    )
    pid = int(res.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid) and out.read_text() == ""
