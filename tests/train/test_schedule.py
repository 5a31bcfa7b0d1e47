"""Learning-rate schedules against their closed forms, computed here independently."""
from __future__ import annotations

import math

import pytest

from diffllm.train.config import OptimConfig
from diffllm.train.schedule import lr_at


def opt(**kw) -> OptimConfig:
    return OptimConfig(**{"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, **kw})


def test_warmup_is_linear_and_never_zero():
    o = opt()
    assert [lr_at(i, 100, o) for i in range(10)] == pytest.approx([(i + 1) / 10 for i in range(10)])


def test_linear_decays_to_the_floor_at_the_last_step():
    """The paper's: peak after warmup, then a straight line to min_lr on the final update."""
    o = opt(schedule="linear")
    assert lr_at(10, 100, o) == pytest.approx(1.0)
    assert lr_at(99, 100, o) == pytest.approx(0.1)
    assert lr_at(54, 100, o) == pytest.approx(1.0 - 0.9 * 44 / 89)
    lrs = [lr_at(i, 100, o) for i in range(10, 100)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))


def test_paper_3b_schedule_end_points():
    o = OptimConfig(lr=3.2e-4, min_lr=1.28e-5, warmup_steps=1000, schedule="linear")
    assert lr_at(999, 238419, o) == pytest.approx(3.2e-4)
    assert lr_at(238418, 238419, o) == pytest.approx(1.28e-5)


def test_cosine_midpoint_and_ends():
    o = opt(schedule="cosine")
    assert lr_at(10, 111, o) == pytest.approx(1.0)
    assert lr_at(110, 111, o) == pytest.approx(0.1)
    assert lr_at(60, 111, o) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_wsd_is_flat_then_decays_over_the_last_fraction():
    o = opt(schedule="wsd", decay_fraction=0.2)
    assert all(lr_at(i, 100, o) == 1.0 for i in range(10, 80))
    assert lr_at(80, 100, o) == pytest.approx(1.0)
    assert lr_at(99, 100, o) == pytest.approx(0.1)
    assert lr_at(90, 100, o) == pytest.approx(1.0 - 0.9 * 10 / 19)


def test_constant_and_warmup_longer_than_the_run():
    assert lr_at(50, 100, opt(schedule="constant")) == 1.0
    short = opt(warmup_steps=1000)
    assert lr_at(0, 4, short) == pytest.approx(0.25) and lr_at(3, 4, short) == pytest.approx(1.0)
