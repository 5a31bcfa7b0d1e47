"""diffllm: pretrain Transformers and Differential Transformers with DeepSpeed ZeRO, and measure the difference."""
__version__ = "0.1.0"
