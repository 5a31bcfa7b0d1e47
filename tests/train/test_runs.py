"""diffllm.runs: a trained model loads back from a run directory for every ZeRO stage (its held-out loss equals the one
the training engine reported), and every damaged or missing piece is a one-line error naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffllm.runs import Checkpoint, Run, choose_tokenizer, exception_line, find_checkpoint, read_meta
from tests.distributed import run_train
from tests.train.helpers import STEPS, TINY


def held_out_loss(model, tokenizer) -> float:
    """The trainer's validation: 4 batches of 4 windows from the held-out plays, mean token loss."""
    from diffllm.config import build, compose
    from diffllm.data import DataConfig, build_val_batches

    data = build(DataConfig, compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"]).data, "data")
    batches = [b.tokens for b in build_val_batches(data, tokenizer, 4, 4, max_tokens=4096)]  # TINY
    with torch.no_grad():
        total = sum(
            F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten(), reduction="sum").item() for b in batches
        )
    return total / sum(b[:, 1:].numel() for b in batches)


@pytest.fixture(scope="module")
def zero0_run(tokenizer, tmp_path_factory):
    """A finished single-process ZeRO-0 run (the micro sweep's setting): DeepSpeed writes no ZeRO shards for it."""
    root = tmp_path_factory.mktemp("zero0")
    run_train(
        TINY + [f"run_dir={root / 'run'}", "trainer.zero_stage=0", f"trainer.tokens={8 * 1024}"],
        1,
        root / "logs",
        launcher="plain",
    )
    return root / "run"


@pytest.mark.slow
def test_zero0_checkpoint_loads_and_reproduces_the_reported_loss(zero0_run, tokenizer):
    cfg, model, _ = Run(zero0_run).model(tokenizer=False)
    assert cfg.arch == "diff" and not model.training
    reported = json.loads((zero0_run / "summary.json").read_text())["last_val_loss"]  # the in-loop set
    assert held_out_loss(model, tokenizer) == pytest.approx(reported, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["run_dir", "tag_dir", "step"])
def test_zero2_two_rank_checkpoint_loads_from_any_path(reference, tokenizer, how):
    run_dir = reference(2)
    run = {
        "run_dir": Run(run_dir),
        "tag_dir": Run(run_dir / "checkpoints" / f"step{STEPS}"),
        "step": Run(run_dir / "checkpoints"),
    }[how]
    _, model, _ = run.model(step=STEPS if how == "step" else "latest", tokenizer=False)
    reported = json.loads((run_dir / "summary.json").read_text())["last_val_loss"]  # the in-loop set
    assert held_out_loss(model, tokenizer) == pytest.approx(reported, abs=1e-5)
    assert Run(run_dir).steps() == [8, 12, 16] and Run(run_dir).is_finished()


@pytest.mark.slow
def test_damaged_checkpoint_files_are_one_line_errors(zero0_run, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(zero0_run, run_dir)
    tag = find_checkpoint(run_dir / "checkpoints").path
    states = tag / "mp_rank_00_model_states.pt"
    states.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ValueError, match=r"step8: cannot read its weights .*damaged") as e:
        Run(run_dir).model(tokenizer=False)
    assert "\n" not in str(e.value)
    (tag / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"step8/meta.json: not valid JSON .*damaged"):
        read_meta(tag)
    with pytest.raises(ValueError, match=r"no checkpoint at that step \(steps: 4, 8\)"):
        Run(run_dir).checkpoint(5)


def test_paths_that_are_not_runs(tmp_path):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a run directory"):
        Run(a_file)
    with pytest.raises(ValueError, match=r"no checkpoints \(train it first"):
        Run(tmp_path).model()
    with pytest.raises(ValueError, match=r"step='last': expected latest or a step number"):
        Run(tmp_path).checkpoint("last")
    assert Run(tmp_path).summary() is None and not Run(tmp_path).is_finished()
    (tmp_path / "summary.json").write_text("[1,")
    with pytest.raises(ValueError, match=r"summary.json: not valid JSON"):
        Run(tmp_path).summary()
    (tmp_path / "summary.json").write_text('{"a": "b\x01"}')  # json's message ends in "at": said once
    with pytest.raises(ValueError, match=r"not valid JSON \(Invalid control character at: line 1 column 9\)"):
        Run(tmp_path).summary()


def test_choose_tokenizer_is_the_one_decision_in_its_order(tmp_path):
    """kept (own, then the resumed run's) > data.tokenizer.path > init_from's (a tokenizer.json or an HF folder) >
    None (the configured default)."""
    run, other, hf, hf_slow = (Run(tmp_path / n) for n in ("run", "other", "hf", "hf_slow"))
    for r in (run, other, hf, hf_slow):
        r.dir.mkdir()
    (other.dir / "tokenizer.json").write_text("{}")
    (hf.dir / "tokenizer.json").write_text("{}")
    (hf_slow.dir / "tokenizer_config.json").write_text("{}")
    from_other = Checkpoint(other.checkpoints_dir, "step4", {"step": 4, "model": {}})
    assert choose_tokenizer(run) == (None, False)
    assert choose_tokenizer(run, init_from=hf.dir) == (hf.dir / "tokenizer.json", False)
    assert choose_tokenizer(run, init_from=hf_slow.dir) == (hf_slow.dir, False)
    assert choose_tokenizer(run, configured="my/tok.json", init_from=hf.dir) == (Path("my/tok.json"), False)
    assert choose_tokenizer(run, from_other, configured="my/tok.json") == (other.dir / "tokenizer.json", True)
    assert choose_tokenizer(run, from_other, init_from=hf.dir) == (other.dir / "tokenizer.json", True)
    run.write_config({"data": {"tokenizer": {"path": "old/tok.json"}}}, own_tokenizer=False)
    assert choose_tokenizer(run) == (None, False)  # a path in config.yaml is no tokenizer the run keeps
    run.write_tokenizer("{}")
    assert choose_tokenizer(run, configured="my/tok.json") == (run.dir / "tokenizer.json", True)


@pytest.mark.parametrize(
    "message, shown",
    [
        ("short and whole", "short and whole"),
        ("first line whole, however long it is not\nsecond line", "first line whole, however long it is not"),
        ("One sentence. " * 30, ("One sentence. " * 17).strip()),  # the sentences that fit in 240 characters
        ("word " * 60, ("word " * 48).strip() + " ..."),  # no sentence end: cut at a word, marked
    ],
)
def test_exception_line_shows_whole_sentences(message, shown):
    assert exception_line(RuntimeError(message)) == f"RuntimeError: {shown}"
