"""In-loop evaluation (trainer.eval, diffllm/train/eval_hook.py) in real runs: a 2-rank ZeRO-3 run with the hook
trains bit for bit like the uninterrupted reference without it; what it logs equals `diffllm eval ppl`'s and `eval
needle`'s functions on the checkpoint of that step; a run killed and relaunched logs the same evaluations; a bad
trainer.eval value is one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from diffllm.runs import read_metrics
from tests.distributed import REPO, base_env, launch_train, run_train
from tests.train.helpers import STEPS, comparable, tiny

EVERY = 4
EVAL = [
    f"trainer.eval.every={EVERY}",
    "trainer.eval.at_end=true",
    "trainer.eval.ppl_data=[shakespeare]",
    "trainer.eval.ppl_max_tokens=2048",
    "trainer.eval.batch_size=8",
    "trainer.eval.needle_n=[1,2]",
    "trainer.eval.needle_trials=4",
    "trainer.eval.needle_length=64",
    "trainer.eval.needle_seed=7",
]


def is_eval(record: dict) -> bool:
    return any(k.startswith("eval/") for k in record)


def evals(run_dir) -> dict[int, dict]:
    """step -> the evaluation record, timings left out."""
    return {m["step"]: {k: v for k, v in m.items() if k != "eval/time_s"} for m in read_metrics(run_dir) if is_eval(m)}


def client_state(run_dir, step: int) -> dict:
    """What the trainer saved beside the weights at `step` (train state, data-stream states, RNG states, config)."""
    (path,) = (run_dir / "checkpoints" / f"step{step}").glob("*rank_0_mp_rank_00_model_states.pt")
    return torch.load(path, map_location="cpu", weights_only=False)["diffllm"]


def same(a, b) -> bool:
    """Exact equality through dicts, lists and tuples of tensors, arrays and plain values."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def eval_run(tokenizer, tmp_path_factory):
    """The ZeRO-3 reference run's config on 2 ranks, with in-loop evaluation every 4 steps and at the end."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    # with reference(3)'s DataLoader worker: starting one draws a seed from torch's generator, which the test compares
    run = run_train(tiny(run_dir, 3, *EVAL, workers=True), 2, run_dir.parent / "logs")
    return run_dir, run.output(0)


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_the_hook(reference, eval_run):
    run_dir, out = eval_run
    ours = [m for m in read_metrics(run_dir) if not is_eval(m)]
    assert comparable(ours) == comparable(read_metrics(reference(3)))
    mine, theirs = client_state(run_dir, STEPS), client_state(reference(3), STEPS)
    # no rank drew from torch's global generator (the one the trainer seeds: python's and numpy's start from OS
    # entropy in every launch, so theirs cannot be compared between two runs)
    assert same([r["torch"] for r in mine["rng"]], [r["torch"] for r in theirs["rng"]])
    assert same(mine["data"], theirs["data"])  # nor read from the training data stream
    assert sorted(evals(run_dir)) == list(range(EVERY, STEPS + 1, EVERY))  # every 4 steps; the last one only once
    assert f"[diffllm.train] eval step {STEPS}: shakespeare loss " in out and " | needle n1 " in out, out[-3000:]


@pytest.mark.slow
def test_logged_ppl_and_needle_equal_the_eval_functions_on_the_checkpoint(eval_run, tmp_path):
    """The checkpoint of step 12 scored by `diffllm eval ppl`'s run_ppl (same data, max_tokens, batches) and by
    needle_accuracy (same task and seed) on the consolidated fp32 weights of the ZeRO-3 shards."""
    from diffllm.eval.needle import NeedleTask, needle_accuracy
    from diffllm.eval.ppl import PplConfig, run_ppl
    from diffllm.runs import Run

    run_dir, _ = eval_run
    step = 12
    logged = evals(run_dir)[step]
    assert logged["tokens"] == step * 1024
    ppl = run_ppl(
        PplConfig(run=str(run_dir), step=step, data="shakespeare", max_tokens=2048, batch_size=8, out=str(tmp_path))
    )
    (src,) = ppl["sources"].values()  # shakespeare holds out one source
    assert ppl["seq_len"] == 64 and src["tokens"] == 2048
    assert logged["eval/ppl/shakespeare/loss"] == src["loss"]  # the same fp32 forward on the same windows
    assert logged["eval/ppl/shakespeare/bpb"] == src["bits_per_byte"]
    assert logged["eval/ppl/shakespeare/loss"] < evals(run_dir)[EVERY]["eval/ppl/shakespeare/loss"] - 0.3  # learning

    _, model, tok = Run(run_dir).model(step=step)
    task = NeedleTask(
        mode="synthetic",
        n_needles=[1, 2],
        queries=1,
        depths=[0.0, 50.0, 100.0],
        lengths=[64],
        trials=4,
        seed=7,
        batch_size=8,
    )
    res = needle_accuracy(model, tok, task)
    for n in (1, 2):
        assert 0.0 <= logged[f"eval/needle/n{n}/acc"] <= 1.0
        assert logged[f"eval/needle/n{n}/acc"] == res["by_n"][n]
    assert logged["eval/needle/acc"] == res["mean"]


@pytest.mark.slow
def test_a_killed_run_relaunched_logs_the_same_evaluations(eval_run, tmp_path):
    """SIGKILL after step 6 (both ranks): the relaunch resumes from a checkpoint, metrics.jsonl loses the records after
    it, and the evaluations redone (and later ones) equal the uninterrupted run's bit for bit."""
    ref_dir, _ = eval_run
    run_dir = tmp_path / "run"
    args = tiny(run_dir, 3, *EVAL)
    run = launch_train(args, 2, tmp_path / "logs1")
    run.wait_until(lambda: any(m.get("step", 0) >= 6 for m in read_metrics(run_dir)))
    run.kill()
    resumed = run_train(args, 2, tmp_path / "logs2")
    assert "resumed from checkpoint" in resumed.output(0), resumed.output(0)[-3000:]
    assert evals(run_dir) == evals(ref_dir)
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(ref_dir))


def test_bad_values_are_one_line_errors():
    from diffllm.config import compose
    from diffllm.train.config import TrainConfig

    cases = {
        "trainer.eval.ppl_data=[shakspeare]": "trainer.eval.ppl_data: unknown data config 'shakspeare' "
        "(did you mean shakespeare?)",
        "trainer.eval.needle_n=[0,2]": "trainer.eval.needle_n=[0, 2]: each must be in 1..",
        "trainer.eval.needle_mode=txt": "trainer.eval.needle_mode: got 'txt', expected one of",
        "trainer.eval.every=-1": "trainer.eval.every: must be >= 0, got -1",
        "trainer.eval.recall_n=[16]": "trainer.eval.recall_length=64: cannot hold 16 pairs, 16 queries and gap=16",
        "trainer.eval.recall_n=[40]": "trainer.eval.recall_n=40: must be in 1..32",
        "trainer.eval.recall_trials=0": "trainer.eval.recall_trials: must be >= 1, got 0",
    }
    for arg, message in cases.items():
        with pytest.raises(ValueError) as e:
            TrainConfig.from_hydra(compose("train", ["trainer.eval.every=4", "trainer.eval.needle_n=[1]", arg]))
        assert str(e.value).startswith(message) and "\n" not in str(e.value), (arg, str(e.value))
    with pytest.raises(ValueError, match=r"^trainer.eval.every: in-loop evaluation is on but measures nothing"):
        TrainConfig.from_hydra(compose("train", ["trainer.eval.every=4"]))
    off = TrainConfig.from_hydra(compose("train", [])).trainer.eval
    assert not off.on and off.ppl_data == [] and off.needle_n == []  # off by default


@pytest.mark.slow
def test_bad_value_on_the_command_line_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffllm.cli",
            "train",
            f"run_dir={tmp_path / 'run'}",
            "trainer.eval.at_end=true",
            "trainer.eval.ppl_data=[shakspeare]",
        ],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == (
        "diffllm train: error: trainer.eval.ppl_data: unknown data config 'shakspeare' (did you mean shakespeare?)"
    )


@pytest.mark.slow
def test_prompts_that_do_not_fit_fail_before_the_first_step(tokenizer, tmp_path):
    run = run_train(
        tiny(
            tmp_path / "run",
            2,
            "trainer.eval.at_end=true",
            "trainer.eval.needle_mode=text",
            "trainer.eval.needle_n=[1]",
            "trainer.eval.needle_length=64",
        ),
        1,
        tmp_path / "logs",
        launcher="plain",
        expect=2,
    )
    out = run.output(0)
    assert (
        "diffllm train: error: trainer.eval.needle_length=64: 64 tokens cannot hold 1 needles and 1 queries" in out
    ), out[-3000:]
    assert "Traceback" not in out and "step 1/" not in out
