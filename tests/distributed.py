"""Run code in N real processes over gloo, as OLMo-core's test harness does: a function (`run_distributed`), or a
`diffllm train` command (`launch_train`: one OS process per rank with torchrun's environment, or real torchrun)."""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nobody listens on right now; another process may take it before it is bound, so only for what needs a
    number in advance (a multi-node rendezvous a user would type) or a port that must stay closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_store() -> tuple[dist.TCPStore, dict]:
    """The rendezvous store held by the test process, as torchrun's agent holds one: its server binds a port the OS
    picks (no window in which another process can take it, as with a port chosen first), and every rank joins it as
    a client (TORCHELASTIC_USE_AGENT_STORE). Keep the store alive until the ranks are done."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return store, dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True")


def base_env(extra: Optional[dict] = None) -> dict:
    """CPU, offline, quiet, one thread per rank (what torchrun sets), no W&B unless asked."""
    env = dict(os.environ)
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def cli(*argv: str, cwd: Path = REPO, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`diffllm <argv>` in a subprocess, as a user types it (base_env: CPU, offline); `unset`: environment variables it
    runs without."""
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", *argv],
        cwd=cwd,
        env={k: v for k, v in base_env().items() if k not in unset},
        capture_output=True,
        text=True,
        timeout=300,
    )


def cli_here(
    *argv: str, cwd: Path = REPO, unset: tuple[str, ...] = (), env: Optional[dict] = None
) -> subprocess.CompletedProcess:
    """`cli` in this process, for what a one-line error is the subject of: the same environment (base_env(env)) and
    working folder while it runs, its stdout, stderr and exit code; the environment, sys.argv and folder restored."""
    from diffllm.cli.main import main

    out, err, code, saved = io.StringIO(), io.StringIO(), 0, (dict(os.environ), list(sys.argv))
    os.environ.clear()
    os.environ.update({k: v for k, v in base_env(env).items() if k not in unset})
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv[:] = saved[1]
    return subprocess.CompletedProcess(["diffllm", *argv], code, out.getvalue(), err.getvalue())


# ----- a function in N processes --------------------------------------------------------------------------------
def _worker(fn: Callable, rank: int, world_size: int, store_env: dict, args: tuple, queue) -> None:
    os.environ.update(
        store_env,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        queue.put((rank, True, fn(*args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable, world_size: int = 2, args: tuple = (), timeout: float = 120) -> list[Any]:
    """fn(*args) on every rank of a fresh gloo world; returns the results in rank order, or raises with the failing
    rank's traceback. `fn` must be importable (a module-level function)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store, store_env = agent_store()  # noqa: F841 - serves the ranks until this function returns
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, store_env, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(results) < world_size:
            rank, ok, value = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]


# ----- `diffllm train` in N processes ---------------------------------------------------------------------------
class Launch:
    """The rank processes of one `python -m diffllm.train` run (or one torchrun process), logs in `log_dir`."""

    def __init__(
        self,
        overrides: list[str],
        world_size: int,
        log_dir: Path,
        cwd: Path,
        env: Optional[dict] = None,
        launcher: str = "procs",
    ):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = base_env(env)
        self.store = None  # `procs`: the ranks' rendezvous store, held as long as this launch lives
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        if launcher == "torchrun":
            cmds = [
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nproc_per_node",
                    str(world_size),
                    "--rdzv_backend",
                    "c10d",
                    "--rdzv_endpoint",
                    "127.0.0.1:0",  # torchrun's own store on a port the OS picks, as `diffllm launch` on one node
                    "-m",
                    "diffllm.train",
                    *overrides,
                ]
            ]
            envs = [env]
        elif launcher == "plain" and world_size == 1:  # no launcher variables at all: the trainer picks its own
            cmds, envs = [[sys.executable, "-m", "diffllm.train", *overrides]], [env]
        else:
            cmds = [[sys.executable, "-m", "diffllm.train", *overrides] for _ in range(world_size)]
            self.store, store_env = agent_store()
            envs = [
                dict(env, **store_env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size))
                for r in range(world_size)
            ]
        for i, (cmd, e) in enumerate(zip(cmds, envs)):
            log = self.log_dir / f"rank{i}.log"
            with open(log, "w") as f:
                self.procs.append(
                    subprocess.Popen(cmd, cwd=cwd, env=e, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
                )
            self.logs.append(log)

    def output(self, i: int = 0) -> str:
        return self.logs[i].read_text()

    def send(self, sig: int) -> None:
        """To every rank process (as SLURM signals every task of a job step)."""
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, sig)

    def kill(self, ranks: Optional[list[int]] = None) -> None:
        """SIGKILL rank processes (default: all) and everything they started (DataLoader workers, torchrun's
        children), and reap them."""
        chosen = [self.procs[i] for i in ranks] if ranks is not None else self.procs
        for p in chosen:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in chosen:
            p.wait()

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(
                f"training did not finish within {timeout} s; rank 0 said:\n{self.output(0)[-4000:]}"
            ) from None

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 300, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a rank exited before the condition held; rank 0 said:\n{self.output(0)[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"condition not reached within {timeout} s; rank 0 said:\n{self.output(0)[-4000:]}")
            time.sleep(poll)


def launch_train(
    overrides: list[str],
    world_size: int,
    log_dir: Path,
    cwd: Path = REPO,
    env: Optional[dict] = None,
    launcher: str = "procs",
) -> Launch:
    """Start `diffllm train` on `world_size` ranks. launcher: procs (one process per rank with RANK/WORLD_SIZE/...),
    torchrun (real torchrun), plain (one process, no launcher variables)."""
    return Launch(overrides, world_size, log_dir, cwd, env, launcher)


def run_train(
    overrides: list[str],
    world_size: int,
    log_dir: Path,
    cwd: Path = REPO,
    env: Optional[dict] = None,
    launcher: str = "procs",
    timeout: float = 300,
    expect: int = 0,
) -> Launch:
    """Launch, wait, and check every rank's exit code (showing rank 0's output when one differs)."""
    run = launch_train(overrides, world_size, log_dir, cwd, env, launcher)
    check_exit(run, run.wait(timeout), expect)
    return run


def check_exit(run: Launch, codes: list[int], expect: int = 0, name: str = "") -> None:
    """Every rank exited with `expect`, else an AssertionError showing the first other rank's output."""
    if any(c != expect for c in codes):
        bad = next(i for i, c in enumerate(codes) if c != expect)
        said = f"{name}: " if name else ""
        raise AssertionError(
            f"{said}exit codes {codes}, expected {expect}; rank {bad} said:\n{run.output(bad)[-6000:]}"
        )


def train_side_by_side(
    runs: dict[str, list[str]],
    log_dir: Path,
    world_size: int = 1,
    launcher: str = "plain",
    timeout: float = 600,
) -> None:
    """Start every run of `runs` (name -> its overrides, run_dir included) at once, then wait for all and check each
    exited 0 (a failure names its run). On 2 cores, one-rank runs of one thread each train two at a time instead of
    one after another. Logs under log_dir/<name>."""
    launches = {name: launch_train(o, world_size, log_dir / name, launcher=launcher) for name, o in runs.items()}
    for name, launch in launches.items():
        check_exit(launch, launch.wait(timeout), name=name)
