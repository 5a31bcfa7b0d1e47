"""Training: DeepSpeed ZeRO pretraining from Hydra configs, with exact and elastic resume and honest metrics.

Entry points: `diffllm train` / `python -m diffllm.train` (app.py); the loop is diffllm.train.loop.Trainer,
its hooks diffllm.train.hooks, its validation diffllm.train.validation."""

from .config import Budget, LoggingConfig, OptimConfig, TrainConfig, TrainerConfig, plan_budget

__all__ = ["Budget", "LoggingConfig", "OptimConfig", "TrainConfig", "TrainerConfig", "plan_budget"]
