"""Portable golden files: what a recorded run stores (its settings, the values and the recording machine's
fingerprint) and how a new run is compared with it: bit for bit on the same fingerprint, within a stated relative
tolerance on any other CPU."""

from __future__ import annotations

import json
import math
import platform
import warnings
from pathlib import Path

import torch

from diffllm.runs import read_metrics
from tests.train.helpers import TINY

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "losses"
ARCHS = ("transformer-tiny", "diff-tiny", "diff2-tiny")
STEPS = 20
# Another CPU's kernels change the last bits from step 0 on: diff-tiny recorded on an AVX-512 machine and on an AVX2
# EPYC differ by at most 4.1e-8 (loss), 1.2e-6 (grad norm) and 0 (val loss) relative over the 20 steps
# (diff-tiny_cpu_fp32_20steps.avx512.json). The bounds are ~100x that and far below what a changed computation gives
# (test_golden.py's test_a_changed_computation_fails_the_tolerance_check).
RTOL = {"loss": 1e-5, "val_loss": 1e-5, "grad_norm": 1e-4, "lr": 1e-12}


def args_for(preset: str) -> list[str]:
    return (
        [f"model={preset}"]
        + [a for a in TINY if not a.startswith(("trainer.tokens=", "data.num_workers="))]  # as recorded: 1 worker
        + [
            f"trainer.tokens={STEPS * 1024}",
            "trainer.precision=fp32",
            "trainer.save_every_steps=0",
            "trainer.val_every=10",
        ]
    )


def golden_path(preset: str) -> Path:
    return ASSETS / f"{preset}_cpu_fp32_20steps.json"


def _cpu_model() -> str:
    try:
        return next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def fingerprint() -> dict:
    """What decides the last bits of a CPU run: torch's SIMD kernel set, the CPU, torch's version, the threads a rank
    runs with (tests/distributed.py sets OMP_NUM_THREADS=1)."""
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "torch": torch.__version__.split("+")[0],
        "threads": 1,
    }


def run_records(run_dir: Path) -> dict:
    records = read_metrics(run_dir)
    steps = [r for r in records if "loss" in r]
    return {
        "loss": [r["loss"] for r in steps],
        "grad_norm": [r["grad_norm"] for r in steps],
        "lr": [r["lr"] for r in steps],
        "val_loss": [r["val_loss"] for r in records if "val_loss" in r],
    }


def check_golden(path: Path, args: list[str], got: dict, record: bool = False) -> str:
    """Compare `got` with the golden file: "bit-exact" on the recording machine's fingerprint, else "tolerance"
    (said as a warning). `record` rewrites the file from `got` first."""
    if record:
        path.write_text(json.dumps({"args": args, "fingerprint": fingerprint(), **got}, indent=1) + "\n")
    golden = json.loads(path.read_text())
    assert golden["args"] == args, "the run's settings changed: re-record the golden file on purpose"
    assert len(got["loss"]) == STEPS and len(got["val_loss"]) == 3
    if golden.get("fingerprint") == fingerprint():
        for key in (k for k in ("loss", "grad_norm", "lr", "val_loss") if k in golden):
            assert got[key] == golden[key], key  # exact float equality: JSON round-trips Python floats bit for bit
        return "bit-exact"
    for key, rtol in ((k, r) for k, r in RTOL.items() if k in golden):  # a file may lack val_loss (see its note)
        for i, (a, b) in enumerate(zip(got[key], golden[key], strict=True)):
            assert math.isclose(a, b, rel_tol=rtol), f"{key}[{i}]: {a} vs golden {b} (rtol {rtol})"
    warnings.warn(
        f"{path.name}: recorded on {golden.get('fingerprint')}, this machine is {fingerprint()}: "
        f"compared within rtol {RTOL}, not bit for bit",
        stacklevel=2,
    )
    return "tolerance"
