"""Weights & Biases: online with a key, offline (files under run_dir/wandb) without one, the same run id on resume."""
from __future__ import annotations

import netrc
import os
import secrets
import string
import sys
from pathlib import Path

from .config import LoggingConfig


def new_run_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(cfg: LoggingConfig) -> str:
    """logging.wandb wins; with `auto`, $WANDB_MODE wins; else online with a key, offline without."""
    if cfg.wandb != "auto":
        return cfg.wandb
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if has_wandb_key() else "offline"


def open_wandb(cfg: LoggingConfig, run_dir: Path, run_id: str, config: dict):
    """The W&B run (rank 0 only), or None when disabled. An online start that fails falls back to offline, loudly."""
    mode = wandb_mode(cfg)
    if mode == "disabled":
        return None
    import wandb

    kwargs = dict(project=cfg.project, entity=cfg.entity, name=cfg.name or Path(run_dir).resolve().name,
                  tags=list(cfg.tags), id=run_id, resume="allow", dir=str(run_dir), config=config,
                  settings=wandb.Settings(quiet=True))  # our progress line already says it all
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        return wandb.init(mode=mode, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure to reach W&B must not cost the training run
        if mode != "online":
            raise
        print(f"[diffllm.train] W&B online start failed ({type(e).__name__}: {e}); logging offline instead",
              file=sys.stderr, flush=True)
        return wandb.init(mode="offline", **kwargs)
