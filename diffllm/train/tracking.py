"""Weights & Biases: online with a key, offline (files under run_dir/wandb) without one, the same run id on resume."""

from __future__ import annotations

import netrc
import os
import secrets
import socket
import string
import sys
from pathlib import Path
from urllib.parse import urlparse

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


def reachable(url: str, timeout: float) -> bool:
    """Can a TCP connection to the W&B server be opened within `timeout` seconds? (A compute node without network
    fails here at once, instead of in wandb.init after its own 90 s.)"""
    u = urlparse(url)
    try:
        with socket.create_connection(
            (u.hostname or "api.wandb.ai", u.port or (443 if u.scheme == "https" else 80)), timeout=timeout
        ):
            return True
    except OSError:
        return False


def open_wandb(cfg: LoggingConfig, run_dir: Path, run_id: str, config: dict):
    """The W&B run (rank 0 only), or None when disabled. Online without a reachable server, or an online start that
    fails within logging.online_timeout_s, falls back to offline with the same run id (sync it later), loudly."""
    mode = wandb_mode(cfg)
    if mode == "disabled":
        return None
    import wandb

    kwargs = dict(
        project=cfg.project,
        entity=cfg.entity,
        name=cfg.name or Path(run_dir).resolve().name,
        tags=list(cfg.tags),
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config,
    )
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    quiet = wandb.Settings(quiet=True)  # our progress line already says it all
    if mode == "online":
        url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        if not reachable(url, min(cfg.online_timeout_s, 10.0)):
            return _offline(wandb, kwargs, f"{url} is not reachable")
        try:
            return wandb.init(
                mode="online", settings=wandb.Settings(quiet=True, init_timeout=cfg.online_timeout_s), **kwargs
            )
        except Exception as e:  # noqa: BLE001 - any failure to reach W&B must not cost the training run
            wandb.teardown()  # the failed start still holds the run id in wandb's service: offline would be refused
            return _offline(wandb, kwargs, f"the online start failed ({type(e).__name__}: {str(e).splitlines()[0]})")
    return wandb.init(mode=mode, settings=quiet, **kwargs)


def _offline(wandb, kwargs: dict, why: str):
    print(
        f"[diffllm.train] W&B: {why}; logging offline to {kwargs['dir']}/wandb with run id {kwargs['id']} "
        f"(upload later: wandb sync)",
        file=sys.stderr,
        flush=True,
    )
    return wandb.init(mode="offline", settings=wandb.Settings(quiet=True), **kwargs)
