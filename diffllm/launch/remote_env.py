"""What DeepSpeed's pdsh launcher exports on the other nodes. pdsh starts each node's `deepspeed.launcher.launch` in a
bare ssh shell that gets only PYTHON*, MLFLOW*, MV2*, UCX* (and the accelerator's own, NCCL* on CUDA) plus the
KEY=VALUE lines of ~/.deepspeed_env and ./.deepspeed_env (or of $DS_ENV_FILE). A diffllm run also depends on the
accelerator, cache and offline settings, so `diffllm launch` writes one file with those, the user's own file and
`--env` on top, and points DS_ENV_FILE at it for the runner's lifetime."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

# Inherited from the launching shell: exact names, and prefixes ending in "_".
FORWARDED = (
    "DS_ACCELERATOR",
    "DS_BUILD_OPS",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "TORCH_CPP_LOG_LEVEL",
    "HF_",
    "WANDB_",
    "DIFFLLM_",
)
# Never inherited, as a word of the name: the export lines travel on pdsh's command line, which `ps` shows to every
# user of the machine.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def _forwarded(name: str) -> bool:
    wanted = any(name == f or (f.endswith("_") and name.startswith(f)) for f in FORWARDED)
    return wanted and not set(name.split("_")) & set(SECRET_WORDS)  # HF_TOKEN, not TOKENIZERS_PARALLELISM


def _user_files(environ: Mapping[str, str]) -> list[Path]:
    """The files DeepSpeed would read on its own, in its order (the later wins): ~/ then ./ $DS_ENV_FILE."""
    name = environ.get("DS_ENV_FILE", ".deepspeed_env")
    return [folder / name for folder in (Path.home(), Path(".")) if (folder / name).is_file()]


def remote_env(environ: Mapping[str, str], explicit: Mapping[str, str]) -> dict[str, str]:
    """Inherited names (FORWARDED), then the user's .deepspeed_env lines, then `--env` (`explicit`) win."""
    env = {k: v for k, v in environ.items() if _forwarded(k)}
    for user in _user_files(environ):
        for line in user.read_text().splitlines():
            key, eq, value = line.partition("=")
            if eq and key.strip():
                env[key.strip()] = value
    env.update({k: str(v) for k, v in explicit.items()})
    return {k: v for k, v in env.items() if "\n" not in v}


def write_env_file(env: Mapping[str, str]) -> Path:
    """KEY=VALUE lines (no blank ones: DeepSpeed splits every line at its first '='); private to this user."""
    fd, path = tempfile.mkstemp(prefix="diffllm-deepspeed-env-")
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in env.items())
    return Path(path)
