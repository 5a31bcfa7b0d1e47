"""`diffllm train [overrides]` / `python -m diffllm.train` / `torchrun -m diffllm.train`: the Hydra app and exit codes."""
from __future__ import annotations

import sys

import torch.distributed as dist
from omegaconf import DictConfig

from ..config import hydra_app
from .dist import strip_local_rank
from .loop import Trainer

EXIT_BAD_INPUT = 2  # a bad config key/value or an unusable checkpoint/data state: the one-line message says which


@hydra_app("train")
def _app(cfg: DictConfig) -> None:
    try:
        code = Trainer(cfg).run()
    except ValueError as e:  # our config/data/checkpoint errors: one line naming the culprit, no traceback
        print(f"diffllm train: error: {e}", file=sys.stderr, flush=True)
        code = EXIT_BAD_INPUT
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)


def main() -> None:
    """Exit codes: 0 finished, 2 bad input, 3 stopped by a signal after saving (relaunch to continue),
    4 too many non-finite steps in a row."""
    sys.argv = [sys.argv[0]] + strip_local_rank(sys.argv[1:])
    _app()
