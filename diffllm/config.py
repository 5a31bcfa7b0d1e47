"""Config plumbing shared by every command: where the Hydra configs live, and typed dataclasses from config nodes."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

import hydra
from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(os.environ.get("DIFFLLM_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))
T = TypeVar("T")


def hydra_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """`@hydra_app("train")` = `@hydra.main` on configs/train.yaml."""
    return hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base=None)


def build(cls: type[T], node: Any, prefix: str) -> T:
    """A typed dataclass from a config node; an unknown key is a one-line error naming it (e.g. `model.d_modle`)."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{prefix}.{unknown[0]}: unknown key (valid keys: {', '.join(sorted(fields))})")
    return cls(**values)


def compose(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    """The config a command would see, without running it (tests, scripts)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides or [])
