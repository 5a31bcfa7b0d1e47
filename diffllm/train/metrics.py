"""Honest throughput metrics: dense bf16 peaks looked up by device name, MFU, the progress line, and the one writer of
metrics.jsonl and W&B (MetricsWriter)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Mapping, Optional

import torch

from ..hardware import peak_tflops  # noqa: F401  (re-exported: the loop looks peaks up here)
from ..runs import METRICS_FILE, Run


def device_name() -> str:
    return (
        torch.cuda.get_device_name()
        if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") == "cuda"
        else "cpu"
    )


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s (6N + attention, no recomputation) over the dense peak."""
    if peak is None or tokens_per_s_per_device <= 0:
        return None
    return tokens_per_s_per_device * flops_per_token / (peak * 1e12)


def human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{1 if abs(n) < 100 * scale else 0}f}{unit}"
    return f"{n:.0f}"


def duration(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(rec: dict, steps: int, budget_tokens: int, eta_s: float) -> str:
    loss = "nan" if rec["loss"] is None else f"{rec['loss']:.4f}"
    gnorm = "n/a" if rec["grad_norm"] is None or not math.isfinite(rec["grad_norm"]) else f"{rec['grad_norm']:.3f}"
    util = "n/a" if rec["mfu"] is None else f"{100 * rec['mfu']:.1f}%"
    skipped = f" | skipped {rec['skipped_steps']}" if rec.get("skipped_steps") else ""
    lam = f" | λmin {rec['lambda_min']:.3f}" if rec.get("lambda_min") is not None else ""
    spike = f" | SPIKE {rec['spike']} (spikes {rec['spikes']})" if rec.get("spike") else ""
    return (
        f"step {rec['step']}/{steps} | tokens {human(rec['tokens'])}/{human(budget_tokens)} | loss {loss} | "
        f"lr {rec['lr']:.3e} | gnorm {gnorm} | {human(rec['tokens_per_s'])} tok/s | MFU {util} | "
        f"ETA {duration(eta_s)}{skipped}{spike}{lam}"
    )


def finite_or_none(x: Optional[float]) -> Optional[float]:
    """JSON has no NaN: a non-finite value is written as null (with `nonfinite: true` beside it)."""
    return None if x is None or not math.isfinite(x) else float(x)


class MetricsLog:
    """metrics.jsonl (rank 0; the file is diffllm.runs' Run), plus the same records to W&B when a run is open."""

    def __init__(self, run_dir: Path, wandb_run=None):
        self.run = Run(run_dir)
        self.path = self.run.dir / METRICS_FILE
        self.wandb = wandb_run

    def truncate_after(self, step: int) -> int:
        """On resume: drop records of steps after the checkpoint (they are recomputed). Returns how many."""
        return self.run.truncate_metrics(step)

    def write(self, rec: dict) -> None:
        self.run.append_metrics(rec)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in rec.items() if k != "step" and v is not None}, step=rec["step"])


def logged(record: Mapping, log_every: int, steps: int) -> bool:
    """Whether a step's record is written: every log_every steps, the last step, and any skipped or spiking step."""
    return record["step"] % log_every == 0 or record["step"] == steps or bool(record["skipped"]) or "spike" in record


class MetricsWriter:
    """The one writer of metrics.jsonl (and W&B) and of the progress line, on rank 0: a step's record after every hook
    contributed to it (when `logged`), then the records logged during the step (validation, evaluation), in order."""

    def __init__(self, rank: int, log_every: int, steps: int, budget_tokens: int, global_batch_tokens: int):
        self.rank, self.log_every, self.steps = rank, log_every, steps
        self.budget_tokens, self.global_batch_tokens = budget_tokens, global_batch_tokens
        self.log: Optional[MetricsLog] = None
        self.pending: list[dict] = []

    def open(self, run_dir: Path, after_step: int, wandb_run_of, say) -> None:
        """Rank 0: metrics.jsonl, with the records after `after_step` (the checkpoint resumed) dropped; then W&B
        (`wandb_run_of()`: the W&B run or None)."""
        if self.rank != 0:
            return
        self.log = MetricsLog(run_dir)
        dropped = self.log.truncate_after(after_step)
        if dropped:
            say(f"metrics.jsonl: dropped {dropped} records after step {after_step} (they are redone now)")
        self.log.wandb = wandb_run_of()

    def add(self, record: dict) -> None:
        """A record of its own (validation, an evaluation), written at the next `flush`."""
        if self.rank == 0:
            self.pending.append(record)

    def step(self, record: dict) -> None:
        """The step's record, with every hook's keys (its step_time_s is not written), then the pending records."""
        record = {k: v for k, v in record.items() if k != "step_time_s"}
        if self.rank == 0 and logged(record, self.log_every, self.steps):
            self.log.write(record)
            eta = (self.steps - record["step"]) * self.global_batch_tokens / max(record["tokens_per_s"], 1e-9)
            print(progress_line(record, self.steps, self.budget_tokens, eta), flush=True)
        self.flush()

    def flush(self) -> None:
        for record in self.pending:
            self.log.write(record)
        self.pending = []

    def close(self) -> None:
        if self.log is not None and self.log.wandb is not None:
            self.log.wandb.finish()
