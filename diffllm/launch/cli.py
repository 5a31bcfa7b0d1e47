"""`diffllm launch [--launcher torchrun|deepspeed|slurm] [--nodes N] [--procs P] [--dry-run] [--<option> V ...]
[train overrides ...]`: options are LaunchConfig fields (defaults: configs/launch.yaml, then
configs/launcher/<launcher>.yaml); every other argument goes to `diffllm train` unchanged."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ..config import CONFIG_DIR, build
from .commands import LaunchConfig, deepspeed_argv, shell, tool, torchrun_argv
from .slurm import sbatch_script

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
        if not arg.startswith("--"):
            overrides.append(arg)
            continue
        key, _, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in names:
            raise ValueError(f"--{key.replace('_', '-')}: unknown launch option (valid: "
                             f"{', '.join('--' + n.replace('_', '-') for n in names)})")
        if not value and names[key].type in ("bool", bool) and (i >= len(argv) or argv[i] not in ("true", "false")):
            value = "true"  # a bare flag: --dry-run
        elif not value:
            if i >= len(argv):
                raise ValueError(f"--{key.replace('_', '-')}: needs a value")
            value, i = argv[i], i + 1
        if key == "setup":
            setup.append(value)
        elif key == "env":
            k, eq, v = value.partition("=")
            if not eq:
                raise ValueError(f"--env {value}: expected KEY=VALUE")
            env[k] = v
        else:
            given[key] = value
    base = OmegaConf.load(CONFIG_DIR / "launch.yaml")
    launcher = str(given.get("launcher", base.get("launcher", "torchrun")))
    per_launcher = CONFIG_DIR / "launcher" / f"{launcher}.yaml"
    if not per_launcher.exists():
        raise ValueError(f"--launcher {launcher}: no configs/launcher/{launcher}.yaml "
                         f"(known: {', '.join(sorted(p.stem for p in per_launcher.parent.glob('*.yaml')))})")
    merged = OmegaConf.merge(base, OmegaConf.load(per_launcher), given)
    if setup:
        merged.setup = list(merged.get("setup") or []) + setup
    if env:
        merged.env = {**(merged.get("env") or {}), **env}
    cfg = build(LaunchConfig, merged, "launch")
    cfg.validate()
    return cfg, overrides


def run(cfg: LaunchConfig, overrides: list[str]) -> int:
    """Print the exact command (or script), then run it unless dry_run. Returns the exit code."""
    if cfg.launcher == "slurm":
        text = sbatch_script(cfg, overrides)
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
        print(f"# run this same command on each of the {cfg.nodes} nodes", file=sys.stderr)
    if cfg.dry_run:
        return 0
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu" if not _has_cuda() else "cuda")
    return subprocess.call(argv, env=env)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    from ..scaling.planner import check_model_overrides

    argv = sys.argv[1:]
    check_model_overrides(argv, "diffllm launch")
    try:
        cfg, overrides = parse_args(argv)
        code = run(cfg, overrides)
    except ValueError as e:
        sys.exit(f"diffllm launch: {e}")
    sys.exit(code)
