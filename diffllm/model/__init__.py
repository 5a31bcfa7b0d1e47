"""Models: one decoder-only LM whose attention (standard or differential) is chosen by `ModelConfig.arch`."""
from .config import ModelConfig
from .transformer import Block, DecoderLM

__all__ = ["ModelConfig", "DecoderLM", "Block"]
