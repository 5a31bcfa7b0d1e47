"""Models: one decoder-only LM whose attention variant (registered in registry.py) is chosen by `ModelConfig.arch`.
The names below load their module (and torch) on first use, so that reading configs and `--help` stay light."""

import importlib

_WHERE = {
    "KVCache": "cache",
    "ModelConfig": "config",
    "DecoderLM": "decoder",
    "Block": "decoder",
    "AttentionVariant": "variant",
    "variant": "registry",
    "variants": "registry",
}
__all__ = list(_WHERE)


def __getattr__(name: str):  # PEP 562
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
