"""diffllm: pretrain Transformers and Differential Transformers with DeepSpeed ZeRO, and measure the difference."""

import os

# Before torch loads OpenMP, for every command (training, evaluation, export): on a CPU shared with other jobs,
# OpenMP's default spin-waiting made a 2-thread training step 10-20x slower whenever one core was busy elsewhere
# (measured on the 2-core CI machine); sleeping waits cost nothing measurable on an idle machine. An explicit
# OMP_WAIT_POLICY is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
