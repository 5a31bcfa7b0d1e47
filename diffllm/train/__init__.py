"""Training: DeepSpeed ZeRO pretraining from Hydra configs, with exact and elastic resume and honest metrics."""
from .config import Budget, LoggingConfig, OptimConfig, TrainerConfig, parse_tokens, plan_budget
from .loop import EXIT_FINISHED, EXIT_NONFINITE, EXIT_PREEMPTED, Trainer

__all__ = ["Budget", "LoggingConfig", "OptimConfig", "TrainerConfig", "parse_tokens", "plan_budget", "Trainer",
           "EXIT_FINISHED", "EXIT_PREEMPTED", "EXIT_NONFINITE"]
