"""`diffllm train [overrides]` / `python -m diffllm.train` / `torchrun -m diffllm.train`: the Hydra app over the train
config's typed configs (SCHEMA: train_schema(), diffllm/train/config.py) and its exit codes.
The trainer is imported when the app runs, so that composing a train config (and --help) stays light."""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from omegaconf import DictConfig

from ..config import hydra_app
from ..errors import UserError
from .config import TrainConfig, train_schema

EXIT_BAD_INPUT = 2  # a bad config key/value or an unusable checkpoint/data state: the one-line message says which
EXIT_PEER_LOST = 6  # a collective failed: another rank ended or stopped answering (its own log says why)
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout")


SCHEMA = train_schema()  # the typed configs of configs/train.yaml


def lost_peer(e: BaseException) -> bool:
    """A collective failed because another rank's process ended or stopped answering (gloo/NCCL)."""
    import torch.distributed as dist

    return isinstance(e, getattr(dist, "DistError", ())) or any(s in str(e) for s in PEER_LOST)


@hydra_app("train", SCHEMA)
def _app(cfg: DictConfig, typed: dict[str, Any]) -> None:
    import torch.distributed as dist

    from .loop import Trainer

    try:
        code = Trainer(TrainConfig.from_typed(typed)).run()
    except UserError as e:  # our config/data/checkpoint errors: one line naming the culprit, no traceback
        print(f"diffllm train: error: {e}", file=sys.stderr, flush=True)
        code = EXIT_BAD_INPUT
    except RuntimeError as e:
        if not lost_peer(e):
            raise
        why = str(e).strip().splitlines()[0][-160:] if str(e).strip() else type(e).__name__
        print(
            f"[diffllm.train] error: rank {os.environ.get('RANK', '0')}: a collective failed because another rank "
            f"ended or stopped answering ({why}); its log says why; this rank stops too (exit code "
            f"{EXIT_PEER_LOST}); relaunch to resume from the last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        code = EXIT_PEER_LOST
    if dist.is_initialized():
        dist.destroy_process_group()
    # Everything is saved, closed and flushed here. The interpreter's own teardown after torch + DeepSpeed (which
    # imports torch's inductor for its ZeRO optimizer check) takes 5-7 s on a 2-core machine: skip it. One thing it
    # did matters: a closed DataLoader iterator left in a reference cycle (a run stopped early, e.g. exit 4) still
    # holds its queues' named semaphores, and the resource tracker would report them as "leaked" once we are gone.
    gc.collect()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    from ..data.workers import end_children

    end_children()  # os._exit runs no cleanup: whatever this rank started (forkserver, workers) ends with it now
    os._exit(code)


def main() -> None:
    """Exit codes: 0 finished (EXIT_FINISHED), 2 bad input, 3 stopped by SIGTERM/SIGINT/SIGUSR1 after saving a
    checkpoint: relaunch to continue (EXIT_PREEMPTED), 4 too many non-finite steps in a row (EXIT_NONFINITE), 5 no
    progress for trainer.stall_timeout_s (EXIT_STALLED: the one-line error names the stalled phase; relaunch), 6 a
    collective failed because another rank ended or stopped answering (EXIT_PEER_LOST; the other rank's log says
    why), 7 a loss or grad-norm spike with trainer.spikes.action=stop, or trainer.spikes.max_consecutive_skips
    skipped in a row, after saving a checkpoint (EXIT_SPIKES), 8 another job took over the run directory's lock after
    this job's heartbeat stalled for 120 s: stopped at once without saving (EXIT_LOCK_LOST, diffllm/train/lock.py);
    diffllm/train/loop.py defines the others."""
    _app()
