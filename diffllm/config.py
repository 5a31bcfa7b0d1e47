"""Config plumbing shared by every command: where the Hydra configs live, and typed dataclasses from config nodes."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = Path(os.environ.get("DIFFLLM_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))
T = TypeVar("T")


def hydra_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """`@hydra_app("train")` = `@hydra.main` on configs/train.yaml."""
    return hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base=None)


def build(cls: type[T], node: Any, prefix: str) -> T:
    """A typed dataclass from a config node, checked against the dataclass's fields and types: an unknown key or a
    value of the wrong type is a one-line ValueError naming it (e.g. `model.d_modle: unknown key`)."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{prefix}.{unknown[0]}: unknown key (valid keys: {', '.join(sorted(fields))})")
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(cls), values), resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ValueError(f"{prefix}.{key}: {str(e).splitlines()[0]}") from None
    return cls(**typed)


def compose(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    """The config a command would see, without running it (tests, scripts)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides or [])
