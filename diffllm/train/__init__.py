"""Training: DeepSpeed ZeRO pretraining from Hydra configs, with exact and elastic resume and honest metrics.

Entry points: `diffllm train` / `python -m diffllm.train` (app.py); the loop is diffllm.train.loop.Trainer,
its hooks diffllm.train.hooks."""
import os

# Before torch loads OpenMP: on a CPU shared with other jobs, OpenMP's default spin-waiting made a 2-thread training
# step 10-20x slower whenever one core was busy elsewhere (measured on the 2-core CI machine); sleeping waits cost
# nothing measurable on an idle machine. An explicit OMP_WAIT_POLICY is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .config import Budget, LoggingConfig, OptimConfig, TrainConfig, TrainerConfig, plan_budget  # noqa: E402

__all__ = ["Budget", "LoggingConfig", "OptimConfig", "TrainConfig", "TrainerConfig", "plan_budget"]
