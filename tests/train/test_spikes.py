"""Loss and grad-norm spikes (diffllm/train/spikes.py): the z-score test against a hand computation, and real 2-rank
runs with a spike injected on every rank (trainer.faults.loss_scale_at_steps): detected at the injected steps with
the z-scores recomputed from metrics.jsonl; action=skip leaves the weights bit-identical to the step before; the cap
on consecutive skips and action=stop save and exit 7; a kill -9 and relaunch re-makes the same decisions."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from diffllm.config import build
from diffllm.runs import Run, find_checkpoint, read_metrics
from diffllm.train.config import SpikesConfig
from diffllm.train.spikes import SpikeGuard, SpikeHistory, judge, mean_std, remember
from tests.distributed import launch_train, run_train
from tests.train.helpers import STEPS, comparable, tiny

SPIKES = [7, 10, 14]  # injected: every rank's loss x 1000 at these steps
ARGS = [
    "trainer.spikes.warmup=4",
    "trainer.spikes.window=8",
    "trainer.faults.loss_scale=1000",
    f"trainer.faults.loss_scale_at_steps={SPIKES}",
]


# ----- the test itself, by hand ---------------------------------------------------------------------------------------
def test_mean_std_is_the_hand_computation():
    """[1, 2, 3, 4]: mean 2.5, sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3."""
    assert mean_std([1.0, 2.0, 3.0, 4.0]) == (2.5, pytest.approx(math.sqrt(5 / 3), rel=1e-15))
    assert mean_std([3.0]) is None and mean_std([3.0, 3.0, 3.0]) == (3.0, 0.0)  # no spread: judge tests nothing


def test_judge_arms_after_warmup_is_one_sided_and_slides_its_window():
    cfg = SpikesConfig(window=4, warmup=3, z_loss=3.0, z_grad=3.0)
    h = SpikeHistory()
    seen = []
    for loss, norm in [
        (5.0, 1.0),
        (5.2, 1.1),
        (100.0, 1.0),  # step 3: 2 values in the window, not armed yet
        (4.9, 0.9),
        (0.1, 1.0),  # a drop is no spike
        (4.8, 50.0),
    ]:  # a grad-norm spike only
        v = judge(cfg, h, loss, norm)
        seen.append(v.what)
        remember(cfg, h, v, dropped=False)
    assert seen == [(), (), (), (), (), ("grad_norm",)]
    assert h.losses == [100.0, 4.9, 0.1, 4.8]  # the last 4 (step 3's 100 was not tested: it entered whole)
    clipped = 1.0 + 3.0 * math.sqrt((0.01 + 0.0 + 0.01 + 0.0) / 3)  # [1.1, 1.0, 0.9, 1.0]: mean + z_grad std
    assert h.norms[:3] == [1.0, 0.9, 1.0] and h.norms[3] == pytest.approx(clipped, rel=1e-14)
    assert h.spikes == 1 and h.max_grad_norm == 50.0  # the real value
    window = [100.0, 4.9, 0.1, 4.8]  # the next step's loss against the window by hand
    v = judge(cfg, h, 400.0, 1.0)
    mean, std = sum(window) / 4, statistics.stdev(window)
    assert v.z_loss == pytest.approx((400.0 - mean) / std, rel=1e-14) and v.what == ("loss",)


def test_a_smaller_window_after_a_relaunch_takes_the_last_values():
    h = SpikeHistory(losses=[100.0, 100.0, 1.0, 1.1, 0.9, 1.0], norms=[])
    v = judge(SpikesConfig(window=4, warmup=2, z_loss=3.0), h, 2.0, None)
    assert v.z_loss == pytest.approx((2.0 - 1.0) / statistics.stdev([1.0, 1.1, 0.9, 1.0]), rel=1e-14)


def test_nonfinite_steps_are_not_spikes_and_stay_out_of_the_window():
    cfg = SpikesConfig(window=8, warmup=2)
    h = SpikeHistory(losses=[1.0, 1.1], norms=[1.0, 1.2])
    for loss, norm in [(math.nan, 1.0), (1.0, math.inf)]:
        v = judge(cfg, h, loss, norm)
        remember(cfg, h, v, dropped=False)
        assert v.what == () and v.enters == (None, None)
    assert h.losses == [1.0, 1.1] and h.norms == [1.0, 1.2] and h.spikes == 0


def test_guard_drops_and_counts_in_a_row_and_says_when_to_stop():
    """skip: the gate is judged once per step (DeepSpeed calls the optimizer once per parameter group)."""
    cfg = SpikesConfig(action="skip", window=8, warmup=2, max_consecutive_skips=2)
    guard, h = SpikeGuard(cfg), SpikeHistory(losses=[1.0, 1.1, 0.9], norms=[1.0, 1.1, 0.9])
    calls = []
    for loss in (9.0, 100.0):
        guard.begin(h, loss, lambda: calls.append(1) or 1.0)
        assert guard.drops() and guard.drops() and len(calls) in (1, 2)
        fields = guard.end(1.0)
        assert fields["spike"] == "loss"
    assert h.skips_in_a_row == 2 and h.skipped == 2 and "2 spikes skipped in a row" in guard.stopping()
    guard.begin(h, 1.0, lambda: 1.0)
    assert not guard.drops() and guard.end(1.0) == {} and h.skips_in_a_row == 0 and guard.stopping() is None


@pytest.mark.parametrize(
    "override, message",
    [
        ({"action": "drop"}, "trainer.spikes.action: got 'drop', expected one of ('log', 'skip', 'stop')"),
        ({"warmup": 1}, "trainer.spikes.warmup: must be >= 2"),
        ({"window": 8, "warmup": 16}, "trainer.spikes.window: must be >= trainer.spikes.warmup=16, got 8"),
        ({"z_grad": -1}, "trainer.spikes.z_grad: must be >= 0"),
        ({"max_consecutive_skips": 0}, "trainer.spikes.max_consecutive_skips: must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ValueError) as e:
        build(SpikesConfig, override, "trainer.spikes")
    assert message in str(e.value) and "\n" not in str(e.value)


# ----- real 2-rank runs ---------------------------------------------------------------------------------------------
def records(run_dir) -> dict[int, dict]:
    return {m["step"]: m for m in read_metrics(run_dir) if "loss" in m}


def weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    return Run(run_dir).model(step=step, tokenizer=False)[1].state_dict()


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def hand_z(recs: dict[int, dict], key: str, z_max: float = 6.0, window: int = 8, warmup: int = 4) -> dict:
    """{step: z} of every tested step, recomputed from metrics.jsonl by the documented rule (statistics' mean and
    sample std over the last `window` values; a spike enters clipped to mean + z_max std)."""
    h, zs = [], {}
    for step in sorted(recs):
        x = recs[step][key]
        if len(h) >= warmup:
            mean, std = statistics.fmean(h[-window:]), statistics.stdev(h[-window:])
            zs[step] = (x - mean) / std
            x = mean + z_max * std if zs[step] > z_max else x
        h.append(x)
    return zs


def check_z(recs: dict[int, dict]) -> None:
    """The steps flagged, and their z-scores, are those of the hand computation."""
    for key, z_key in (("loss", "z_loss"), ("grad_norm", "z_grad")):
        zs = hand_z(recs, key)
        assert [s for s, z in zs.items() if z > 6.0] == SPIKES, key
        assert all(recs[s][z_key] == pytest.approx(zs[s], rel=1e-9) for s in SPIKES), key


@pytest.fixture(scope="module")
def skip_run(tokenizer, tmp_path_factory):
    """ZeRO-2, action=skip, a checkpoint every step: the uninterrupted run."""
    tmp = tmp_path_factory.mktemp("skip")
    run_train(
        tiny(tmp / "run", 2, *ARGS, "trainer.spikes.action=skip", "trainer.save_every_steps=1", "trainer.keep_last=20"),
        2,
        tmp / "logs",
    )
    return tmp / "run"


@pytest.mark.slow
def test_skip_detects_the_injected_spikes_and_leaves_the_weights_of_the_step_before(skip_run):
    recs = records(skip_run)
    assert [s for s, r in recs.items() if "spike" in r] == SPIKES
    assert [s for s, r in recs.items() if r["skipped"]] == SPIKES and recs[STEPS]["skipped_steps"] == 3
    check_z(recs)
    for s in SPIKES:
        assert recs[s]["spike"] == "loss+grad_norm" and recs[s]["spike_grad_norm"] == recs[s]["grad_norm"]
        assert same(weights(skip_run, s - 1), weights(skip_run, s))  # the update was dropped on both ranks
        assert not same(weights(skip_run, s), weights(skip_run, s + 1))  # the next one was not
    summary = json.loads((skip_run / "summary.json").read_text())
    assert (summary["spikes"], summary["spike_skips"], summary["skipped_steps"]) == (3, 3, 3)
    assert summary["max_grad_norm"] == max(r["grad_norm"] for r in recs.values())


@pytest.mark.slow
def test_a_relaunch_after_kill_9_remakes_the_same_decisions(skip_run, tmp_path):
    """Killed after the step-4 checkpoint; the relaunch restores the windows (without them, the spikes after the
    resume point would not be armed) and its records equal the uninterrupted run's, spike fields included."""
    run_dir = tmp_path / "run"
    args = tiny(run_dir, 2, *ARGS, "trainer.spikes.action=skip")
    run = launch_train(args, 2, tmp_path / "logs1")
    run.wait_until(lambda: any(m.get("step", 0) >= 5 for m in read_metrics(run_dir)))
    run.kill()
    out = run_train(args, 2, tmp_path / "logs2").output(0)
    assert "resumed from checkpoint" in out, out
    keys = ("spike", "z_loss", "z_grad", "spike_grad_norm", "skipped_steps", "spikes")
    ours, theirs = read_metrics(run_dir), read_metrics(skip_run)
    assert comparable(ours) == comparable(theirs)
    assert [tuple(r.get(k) for k in keys) for r in ours] == [tuple(r.get(k) for k in keys) for r in theirs]


@pytest.mark.slow
def test_log_mode_detects_at_zero3_and_changes_nothing(skip_run, tmp_path):
    """action=log under ZeRO-3 (norm from DeepSpeed's stage-3 optimizer): the same steps flagged, nothing skipped.
    The block grad norms at log steps, gathered from ZeRO-3's partitions here and ZeRO-2's fragments in the skip
    run, agree at step 1 (the same weights and data), and lie below the global norm."""
    run_dir = tmp_path / "run"
    run_train(tiny(run_dir, 3, *ARGS), 2, tmp_path / "logs")
    recs = records(run_dir)
    assert [s for s, r in recs.items() if "spike" in r] == SPIKES and not any(r["skipped"] for r in recs.values())
    check_z(recs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["spikes"], summary["spike_skips"], summary["skipped_steps"]) == (3, 0, 0)
    zero2 = records(skip_run)
    for i in (0, 1):
        assert recs[1][f"grad_norm/{i}"] == pytest.approx(zero2[1][f"grad_norm/{i}"], rel=1e-6)
        assert recs[1][f"act_max/{i}"] == zero2[1][f"act_max/{i}"] > 0
        assert f"attn_logit_max/{i}" not in recs[1] and zero2[1][f"attn_logit_max/{i}"] > 0  # not under ZeRO-3
    assert all(math.hypot(r["grad_norm/0"], r["grad_norm/1"]) < r["grad_norm"] for r in recs.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage, extra, stop_at",
    [
        (
            2,
            [
                "trainer.spikes.action=skip",
                "trainer.spikes.max_consecutive_skips=2",
                "trainer.faults.loss_scale_at_steps=[7,8]",
            ],
            8,
        ),  # the cap: two skipped spikes in a row
        (0, ["trainer.spikes.action=stop"], 7),  # stop at the first spike (ZeRO-0: the norm is ours, before the step)
    ],
)
def test_the_cap_and_stop_save_and_exit_7(tokenizer, tmp_path, stage, extra, stop_at):
    run_dir = tmp_path / "run"
    """The saved checkpoint is the stopping step's, with the weights of the step before the first spike."""
    run_dir = tmp_path / "run"
    saves = ["trainer.save_every_steps=1", "trainer.keep_last=20"]
    run = run_train(tiny(run_dir, stage, *ARGS, *extra, *saves), 2, tmp_path / "logs", expect=7)
    assert f"at step {stop_at}; stopping after saving" in run.output(0) and "(exit code 7)" in run.output(0)
    assert find_checkpoint(run_dir / "checkpoints").step == stop_at and max(records(run_dir)) == stop_at
    assert same(weights(run_dir, 6), weights(run_dir, stop_at))
    assert not (run_dir / "summary.json").exists()
