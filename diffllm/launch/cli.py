"""`diffllm launch [--launcher torchrun|deepspeed|slurm] [--nodes N] [--procs P] [--dry-run] [--<option> V ...]
[train overrides ...]`: options are LaunchConfig fields (defaults: configs/launch.yaml, then
configs/launch/<launcher>.yaml); every other argument goes to `diffllm train` unchanged."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from omegaconf import OmegaConf

from ..config import build, find_config, group_options, load_group
from ..errors import UserError
from ..lifeline import LAUNCHER_ENV, identity, preexec
from .argv import LaunchConfig, deepspeed_argv, shell, tool, torchrun_argv
from .checks import check_hosts_reachable, check_memory, check_train_overrides, local_gpu, needs_ssh
from .help import usage
from .hostfile import read_hostfile
from .relay import Relay
from .remote_env import remote_env, write_env_file
from .slurm import sbatch_script

_USER_CPP_LOG_LEVEL = os.environ.get("TORCH_CPP_LOG_LEVEL")  # main() quiets c10d here; children get this back
EXIT_STOPPED = 3  # Ctrl-C (or SIGTERM) under `diffllm launch`: the workers saved a checkpoint; relaunch to continue
EXIT_BAD_INPUT = 2  # the ranks' own: their one line said it

_LISTS = {"setup", "env"}  # repeatable: --setup "module load cuda" --env NCCL_DEBUG=WARN


def parse_args(argv: list[str]) -> tuple[LaunchConfig, list[str]]:
    names = {f.name: f for f in dataclasses.fields(LaunchConfig)}
    given: dict[str, object] = {}
    setup: list[str] = []
    env: dict[str, str] = {}
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            overrides += argv[i:]
            break
        if arg in ("-h", "--help"):
            raise HelpRequested
        if not arg.startswith("--"):
            overrides.append(arg)
            continue
        key, _, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in names:
            raise UserError(
                f"--{key.replace('_', '-')}: unknown launch option (valid: "
                f"{', '.join('--' + n.replace('_', '-') for n in names)})"
            )
        if not value and names[key].type in ("bool", bool) and (i >= len(argv) or argv[i] not in ("true", "false")):
            value = "true"  # a bare flag: --dry-run
        elif not value:
            if i >= len(argv):
                raise UserError(f"--{key.replace('_', '-')}: needs a value")
            value, i = argv[i], i + 1
        if key == "setup":
            setup.append(value)
        elif key == "env":
            k, eq, v = value.partition("=")
            if not eq:
                raise UserError(f"--env {value}: expected KEY=VALUE")
            env[k] = v
        else:
            given[key] = value
    base = OmegaConf.load(find_config("", "launch"))
    launcher = str(given.get("launcher", base.get("launcher", "torchrun")))
    if find_config("launch", launcher) is None:
        raise UserError(
            f"--launcher {launcher}: no configs/launch/{launcher}.yaml (known: {', '.join(group_options('launch'))})"
        )
    merged = OmegaConf.merge(base, load_group("launch", launcher), given)
    cfg = build(LaunchConfig, merged, "launch")
    # --setup and --env values are shell text for the job script (`source ${HOME}/venv/bin/activate`), never OmegaConf
    # interpolations: they join the built config as given
    cfg = dataclasses.replace(cfg, setup=cfg.setup + setup, env={**cfg.env, **env})
    cfg.validate()
    return cfg, overrides


class HelpRequested(Exception):
    pass


def preflight(cfg: LaunchConfig, overrides: list[str]) -> int:
    """Everything that can be checked before starting or submitting: train overrides, memory on the GPU type (`--gpu`,
    else this machine's), then reachable hosts.
    Returns the run's data workers per rank (what a SLURM job's CPUs are sized by)."""
    train = check_train_overrides(overrides, cfg.nodes * cfg.procs)
    gpu = cfg.gpu or (None if cfg.launcher == "slurm" else local_gpu())  # a SLURM job's GPUs are not this machine's
    if cfg.memory_check and gpu:
        check_memory(train, cfg.nodes, cfg.procs, gpu)
    if needs_ssh(cfg) and not cfg.dry_run:
        check_hosts_reachable(list(read_hostfile(cfg.hostfile))[: cfg.nodes], cfg.hostfile)
    return train.data.num_workers


def run(cfg: LaunchConfig, overrides: list[str]) -> int:
    """Print the exact command (or script), then run it unless dry_run. Returns the exit code."""
    workers = preflight(cfg, overrides)
    if cfg.launcher == "slurm":
        text = sbatch_script(cfg, overrides, data_workers=workers)
        path = Path(cfg.script or Path(cfg.log_dir) / f"{cfg.job_name}.sbatch")
        if cfg.dry_run:
            print(f"# {path}\n{text}", end="")
            return 0
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
        if not cfg.submit:
            return 0
        Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)  # SLURM does not create the --output folder
        return subprocess.call(["sbatch", str(path)])
    if cfg.launcher == "torchrun":
        argv = torchrun_argv(cfg, overrides, executable=tool("torchrun"))
    else:
        argv = deepspeed_argv(cfg, overrides, executable=tool("deepspeed"))
    print(shell(argv), flush=True)
    if cfg.launcher == "torchrun" and cfg.nodes > 1:
        print(
            f"# run this on each of the {cfg.nodes} nodes, each with its own --node-rank (0..{cfg.nodes - 1})",
            file=sys.stderr,
        )
    if cfg.dry_run:
        return 0
    if cfg.launcher == "torchrun" and cfg.nodes > 1:
        from .rendezvous import roll_call

        roll_call(cfg)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    if _USER_CPP_LOG_LEVEL is not None:
        env["TORCH_CPP_LOG_LEVEL"] = _USER_CPP_LOG_LEVEL
    env.setdefault("DS_ACCELERATOR", "cpu" if not _has_cuda() else "cuda")
    env.update({k: str(v) for k, v in cfg.env.items()})
    if cfg.launcher != "deepspeed" or not cfg.hostfile:
        return supervise(argv, env)
    env_file = write_env_file(remote_env(env, cfg.env))  # what the runner exports on every node
    try:
        return supervise(argv, {**env, "DS_ENV_FILE": str(env_file)})
    finally:
        env_file.unlink(missing_ok=True)


def supervise(argv: list[str], env: dict) -> int:
    """Run the launcher in its own session, so that a terminal's Ctrl-C reaches only us; pass Ctrl-C or SIGTERM on
    once (torchrun forwards it to the workers, which finish the step and save) and wait, then exit 3. A second
    Ctrl-C is passed on too: the trainer then stops without saving. The launcher dies with this process and the ranks
    with both (diffllm/lifeline.py: kill -9 of `diffllm launch` leaves no rank training); its stderr is relayed
    (relay.py: what the ranks say, once; torchrun's report of their failure is read, not shown), and the exit code is
    the ranks' (torchrun's own is 1 whatever they said)."""
    proc = subprocess.Popen(
        argv,
        env={**env, LAUNCHER_ENV: identity()},
        start_new_session=True,
        preexec_fn=preexec(),
        stderr=subprocess.PIPE,
    )
    relay = Relay(proc.pid, argv[0], sys.stderr)
    reader = threading.Thread(target=_relay_lines, args=(proc.stderr, relay), name="diffllm-relay", daemon=True)
    reader.start()
    stopped: list[int] = []

    def on_signal(signum: int, frame) -> None:
        if not stopped:
            print(
                f"\ndiffllm launch: {signal.Signals(signum).name}: waiting for the workers to save a checkpoint "
                f"(Ctrl-C again to stop without saving)",
                file=sys.stderr,
                flush=True,
            )
        stopped.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        reader.join(timeout=60)  # the pipe ends when the ranks' last child (a data worker) has gone: moments
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report = relay.close()
    if stopped and code != 0:
        print(
            f"diffllm launch: stopped by {signal.Signals(stopped[0]).name} (launcher exit code {code}); "
            f"relaunch the same command to continue from the last checkpoint",
            file=sys.stderr,
        )
        return EXIT_STOPPED
    ranks = report.exit_code()
    if ranks is None and code < 0:  # the launcher itself was killed (its ranks died with it)
        print(f"diffllm launch: {Path(argv[0]).name} was killed by {signal.Signals(-code).name}", file=sys.stderr)
        return 128 - code
    if ranks is None:
        return code
    if ranks != EXIT_BAD_INPUT:
        print(f"diffllm launch: {report.describe()} (exit code {ranks})", file=sys.stderr, flush=True)
    return ranks


def _relay_lines(stream: IO[bytes], relay: Relay) -> None:
    for raw in iter(stream.readline, b""):
        relay.feed(raw.decode(errors="replace"))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    from ..config import fail
    from ..model.presets import check_model_overrides

    argv = sys.argv[1:]
    # c10d's C++ retry warnings (with stack frames) would bury our one-line rendezvous errors: quiet them in this
    # process (before torch loads); run() gives the launcher's children the user's own setting back.
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    check_model_overrides(argv, "diffllm launch")
    try:
        cfg, overrides = parse_args(argv)
        code = run(cfg, overrides)
    except HelpRequested:
        print(usage(), end="")
        code = 0
    except UserError as e:
        fail("diffllm launch", str(e))
    sys.exit(code)
