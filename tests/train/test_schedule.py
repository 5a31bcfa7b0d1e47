"""Learning-rate schedules against their closed forms, computed here independently."""

from __future__ import annotations

import math

import pytest

from diffllm.train.config import OptimConfig
from diffllm.train.schedule import decay_start, lr_at


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


@pytest.mark.parametrize("warmup,fraction", [(0, 0.2), (10, 0.2), (10, 0.5), (3, 0.01), (10, 1.0)])
def test_a_wsd_branch_has_the_lr_of_a_from_scratch_run_at_every_step(warmup, fraction):
    """A branch of budget D trains the long run's steps before decay_start(D), then its own: its lr equals a D-step
    run's at every step, for every long run of P >= D steps (D after the warmup)."""
    o = opt(schedule="wsd", warmup_steps=warmup, decay_fraction=fraction)
    for d in range(warmup + 1, 120):
        start = decay_start(d, o)
        for p in (d, d + 1, d + 7, 2 * d, 1000):
            branch = [lr_at(s, p, o) for s in range(start)] + [lr_at(s, d, o) for s in range(start, d)]
            assert branch == [lr_at(s, d, o) for s in range(d)], (d, p)


def test_decay_start_is_where_the_lr_first_leaves_the_peak_by_hand():
    """The first decay step holds the peak (progress 0); the next one is below it, counted here from the definition:
    the last round(0.2 x T) steps decay, after a warmup of 10."""
    o = opt(schedule="wsd", warmup_steps=10, decay_fraction=0.2)
    for total in range(12, 200):
        decay = max(1, round(0.2 * total))
        by_hand = max(10, total - decay)
        assert decay_start(total, o) == by_hand
        if total - by_hand > 1:
            first_below = next(s for s in range(total) if s >= 10 and lr_at(s, total, o) < 1.0)
            assert first_below == by_hand + 1
    assert decay_start(50, opt(schedule="wsd", decay_fraction=0.0)) == 50  # nothing decays
