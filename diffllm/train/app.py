"""`diffllm train [overrides]` / `python -m diffllm.train` / `torchrun -m diffllm.train`: the Hydra app and exit codes."""
from __future__ import annotations

import logging
import os
import sys

import torch.distributed as dist
from omegaconf import DictConfig

from ..apps import hydra_app
from .dist import strip_local_rank
from .config import TrainConfig
from .loop import EXIT_FINISHED, EXIT_NONFINITE, EXIT_PREEMPTED, Trainer  # noqa: F401 - documented below

EXIT_BAD_INPUT = 2  # a bad config key/value or an unusable checkpoint/data state: the one-line message says which


@hydra_app("train")
def _app(cfg: DictConfig) -> None:
    try:
        code = Trainer(TrainConfig.from_hydra(cfg)).run()
    except ValueError as e:  # our config/data/checkpoint errors: one line naming the culprit, no traceback
        print(f"diffllm train: error: {e}", file=sys.stderr, flush=True)
        code = EXIT_BAD_INPUT
    if dist.is_initialized():
        dist.destroy_process_group()
    # Everything is saved, closed and flushed here. The interpreter's own teardown after torch + DeepSpeed (which
    # imports torch's inductor for its ZeRO optimizer check) takes 5-7 s on a 2-core machine: skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """Exit codes: 0 finished (EXIT_FINISHED), 2 bad input, 3 stopped by SIGTERM/SIGINT/SIGUSR1 after saving a
    checkpoint: relaunch to continue (EXIT_PREEMPTED), 4 too many non-finite steps in a row (EXIT_NONFINITE), 5 no
    progress for trainer.stall_timeout_s (EXIT_STALLED: the one-line error names the stalled phase; relaunch)."""
    sys.argv = [sys.argv[0]] + strip_local_rank(sys.argv[1:])
    _app()
