"""Golden losses (as torchtitan's tests/assets/losses/): the first 20 steps of the tiny CPU run, one process, fp32,
must give exactly the recorded losses, gradient norms and validation losses. A refactor that changes the numerics
(the order of a reduction, an extra RNG draw, a changed schedule) fails here, bit for bit.

Re-record only for an intended change of numerics, and say so in the commit:
    DIFFLLM_RECORD_GOLDEN=1 python -m pytest -q tests/train/test_golden.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diffllm.runs import read_metrics
from tests.distributed import run_train
from tests.train.helpers import TINY

pytestmark = pytest.mark.slow
GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "losses" / "tiny_cpu_fp32_20steps.json"
STEPS = 20
ARGS = [a for a in TINY if not a.startswith("trainer.tokens=")] + [
    f"trainer.tokens={STEPS * 1024}", "trainer.precision=fp32", "trainer.save_every_steps=0",
    "trainer.val_every=10"]


def test_first_20_losses_match_the_golden_file_bit_for_bit(tokenizer, tmp_path):
    run_train(ARGS + [f"run_dir={tmp_path / 'run'}"], 1, tmp_path / "logs", launcher="plain")
    records = read_metrics(tmp_path / "run")
    got = {"loss": [r["loss"] for r in records if "loss" in r],
           "grad_norm": [r["grad_norm"] for r in records if "loss" in r],
           "lr": [r["lr"] for r in records if "loss" in r],
           "val_loss": [r["val_loss"] for r in records if "val_loss" in r]}
    if os.environ.get("DIFFLLM_RECORD_GOLDEN"):
        GOLDEN.write_text(json.dumps({"args": ARGS, **got}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert golden["args"] == ARGS, "the run's settings changed: re-record the golden file on purpose"
    assert len(got["loss"]) == STEPS and len(got["val_loss"]) == 3
    for key in ("loss", "grad_norm", "lr", "val_loss"):
        assert got[key] == golden[key], key  # exact float equality: JSON round-trips Python floats bit for bit
