"""Data: tokenizers, streaming of HF datasets packed into windows, rank/worker sharding, exact resumable state."""
from .config import DataConfig, DataError, SourceConfig, TokenizerConfig, cache_dir
from .loader import TrainLoader, build_train_loader, build_val_batches, build_val_sets
from .tokenizer import Tokenizer, ensure_tokenizer, load_tokenizer

__all__ = [
    "DataConfig", "DataError", "SourceConfig", "TokenizerConfig", "Tokenizer", "TrainLoader", "build_train_loader",
    "build_val_batches", "build_val_sets", "cache_dir", "ensure_tokenizer", "load_tokenizer",
]
