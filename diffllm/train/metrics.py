"""Honest throughput metrics: dense bf16 peaks looked up by device name, MFU, the progress line, metrics.jsonl, W&B."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import torch

from ..hardware import peak_tflops  # noqa: F401  (re-exported: the loop looks peaks up here)
from ..runs import METRICS_FILE, Run


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") == "cuda" else "cpu"


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
    return (f"step {rec['step']}/{steps} | tokens {human(rec['tokens'])}/{human(budget_tokens)} | loss {loss} | "
            f"lr {rec['lr']:.3e} | gnorm {gnorm} | {human(rec['tokens_per_s'])} tok/s | MFU {util} | "
            f"ETA {duration(eta_s)}{skipped}{spike}{lam}")


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
