"""Model presets: configs/model/<name>.yaml, each listing its bases (configs/model/arch/<arch>.yaml and
configs/model/size/<size>.yaml) in a Hydra defaults list, composed by Hydra into a typed ModelConfig."""

from __future__ import annotations

import difflib
import functools

from omegaconf import OmegaConf

from ..config import build, fail, group_options, load_group
from ..errors import UserError
from .config import ModelConfig


def preset_names() -> list[str]:
    """The selectable presets: configs/model/*.yaml along the config search path (the user's directories first; the
    arch/ and size/ bases below it are not presets)."""
    return group_options("model")


@functools.cache
def _composed(name: str) -> dict:
    return OmegaConf.to_container(load_group("model", name), resolve=True)


def load_preset(name: str) -> ModelConfig:
    """configs/model/<name>.yaml as a ModelConfig; an unknown name is a one-line error with the nearest names."""
    names = preset_names()
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise UserError(f"model={name}: unknown preset ({hint}known: {', '.join(names)})")
    return build(ModelConfig, _composed(name), "model")


def check_model_overrides(argv: list[str], command: str) -> None:
    """Exit with one line naming the culprit when a `model=<preset>` override names no preset (before Hydra does)."""
    for arg in argv:
        if arg.startswith("model=") and "," not in arg:
            try:
                load_preset(arg.split("=", 1)[1])
            except ValueError as e:
                fail(command, str(e))
