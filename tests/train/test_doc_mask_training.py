"""Document masks end to end: a 2-rank ZeRO-2 run on Shakespeare's paragraphs (one document each, so that every
window holds boundaries; a whole play is longer than the tiny runs read) with data.doc_mask=true and positions
restarted per document trains, its losses differ from the unmasked run's from the first step, and a SIGKILL +
relaunch continues it bit for bit; a needle mixture trains on its marked answers only."""

from __future__ import annotations

import json

import pytest

from diffllm.runs import read_metrics
from tests.distributed import launch_train, run_train
from tests.train.helpers import STEPS, comparable, tiny

pytestmark = pytest.mark.slow

PARAGRAPHS = "data.sources.0.sample_by=paragraph"
DOCS = [PARAGRAPHS, "data.doc_mask=true", "data.restart_positions=true"]


def losses_of(run_dir) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if "loss" in m]


def test_doc_mask_trains_and_resumes_bit_for_bit(tmp_path):
    ref_dir = tmp_path / "ref"
    run_train(tiny(ref_dir, 2, *DOCS), 2, tmp_path / "ref-logs")
    losses = losses_of(ref_dir)
    assert len(losses) == STEPS and sum(losses[-4:]) / 4 < losses[0] - 0.7, losses
    run_train(tiny(tmp_path / "plain", 2, PARAGRAPHS, "trainer.tokens=2048"), 2, tmp_path / "plain-logs")
    plain = losses_of(tmp_path / "plain")
    assert len(plain) == 2 and plain[0] != losses[0] and plain[1] != losses[1]  # the masks reached the model
    summary = json.loads((ref_dir / "summary.json").read_text())
    assert summary["doc_mask"] is True and summary["loss_tokens"] == summary["tokens"]

    run_dir = tmp_path / "run"
    run = launch_train(tiny(run_dir, 2, *DOCS), 2, tmp_path / "logs1")
    run.wait_until(lambda: any(m.get("step", 0) >= 6 for m in read_metrics(run_dir)))
    run.kill()
    resumed = run_train(tiny(run_dir, 2, *DOCS), 2, tmp_path / "logs2")
    assert "resumed from checkpoint" in resumed.output(0)
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(ref_dir))


def test_a_needle_mixture_trains_on_its_marked_answers(tmp_path):
    """data=shakespeare-needle with loss_on=marked: the plays count every target, the needle windows only their
    answers, so fewer targets are in the loss than are seen, and the count is the same on every relaunch."""
    run_dir = tmp_path / "run"
    args = tiny(
        run_dir,
        2,
        "data=shakespeare-needle",
        "data.loss_on=marked",
        "data.doc_mask=true",
        "data.tokenizer.train_on=[plays]",
    )
    run_train(args, 1, tmp_path / "logs")
    records = [m for m in read_metrics(run_dir) if "loss" in m]
    last = records[-1]
    assert 0.8 * last["tokens"] < last["loss_tokens"] < last["tokens"]  # ~10% of the windows are needle windows
