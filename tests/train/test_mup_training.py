"""parametrization=mup through the real trainer (DeepSpeed, CPU/gloo): under ZeRO 0, 2 and 3 the optimizer that
DeepSpeed steps holds one group per lr multiplier with lr = the scheduled lr x lr_mult (read back from the saved
optimizer state), and a run stopped by SIGTERM and relaunched logs the same losses bit for bit as the uninterrupted
one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffllm.runs import read_metrics
from tests.distributed import run_train
from tests.train.helpers import resumes_exactly_after_sigterm, tiny

pytestmark = pytest.mark.slow
STEPS = 6
MUP = [
    "model.parametrization=mup",
    "model.base_width=16",
    "trainer.save_every_steps=0",
    f"trainer.tokens={STEPS * 1024}",
]


def groups_in(obj) -> list[dict]:
    """Every optimizer param group (a dict with "lr_mult") anywhere in a loaded checkpoint file."""
    if isinstance(obj, dict):
        if "lr_mult" in obj and "lr" in obj:
            return [obj]
        return [g for v in obj.values() for g in groups_in(v)]
    if isinstance(obj, (list, tuple)):
        return [g for v in obj for g in groups_in(v)]
    return []


def saved_groups(run_dir: Path) -> list[dict]:
    files = sorted(run_dir.rglob("*optim_states.pt")) + sorted(run_dir.rglob("mp_rank_00_model_states.pt"))
    found = [g for f in files for g in groups_in(torch.load(f, map_location="cpu", weights_only=False))]
    assert found, [str(f) for f in files]
    return found


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_lr_multipliers_reach_the_zero_optimizer(tokenizer, tmp_path, stage):
    run_dir = tmp_path / "run"
    run_train(tiny(run_dir, stage, *MUP), 1, tmp_path / "logs", launcher="plain")
    last_lr = [m["lr"] for m in read_metrics(run_dir) if "lr" in m][-1]  # the last step's base lr, as logged
    groups = saved_groups(run_dir)
    assert {g["lr_mult"] for g in groups} == {1.0, 0.25}  # d_model 64 / base_width 16: hidden lr / 4
    for g in groups:
        assert g["lr"] == pytest.approx(last_lr * g["lr_mult"], rel=1e-12), g["lr_mult"]


def test_mup_resumes_exactly_after_sigterm(tokenizer, tmp_path):
    resumes_exactly_after_sigterm(lambda run_dir: tiny(run_dir, 2, *MUP), tmp_path, stop_at=3, steps=STEPS)
