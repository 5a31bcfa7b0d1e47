"""Models: one decoder-only LM whose attention variant (registered in variant.py) is chosen by `ModelConfig.arch`."""
from .cache import KVCache
from .config import ModelConfig
from .transformer import Block, DecoderLM
from .variant import AttentionVariant, variant, variants

__all__ = ["KVCache", "ModelConfig", "DecoderLM", "Block", "AttentionVariant", "variant", "variants"]
