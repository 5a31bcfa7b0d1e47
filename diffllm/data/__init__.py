"""Data: tokenizers, streaming of HF datasets packed into windows, rank/worker sharding, exact resumable state.
The names below load their module (and torch, datasets) on first use, so that reading configs stays light."""

import importlib

_WHERE = {
    "DataConfig": "config",
    "DataError": "config",
    "SourceConfig": "config",
    "TokenizerConfig": "config",
    "cache_dir": "config",
    "TrainLoader": "loader",
    "build_train_loader": "loader",
    "build_val_batches": "loader",
    "build_val_sets": "loader",
    "Tokenizer": "tokenizer",
    "ensure_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "Batch": "batch",
    "Marked": "batch",
}
__all__ = list(_WHERE)


def __getattr__(name: str):  # PEP 562
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
