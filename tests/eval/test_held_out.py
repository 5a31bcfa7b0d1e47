"""Evaluation of a run whose data config holds out a share of its training documents (data.val_fraction): `eval ppl`
scores exactly the windows the trainer validated on (same tokens, same loss), and whole sources only when asked."""

from __future__ import annotations

import json

import pytest

from diffllm.config import build
from diffllm.data import DataConfig, build_val_batches
from diffllm.eval.ppl import main
from diffllm.runs import Run
from tests.distributed import cli


def trainer_val(run_dir) -> tuple[float, int]:
    """(the trainer's last val_loss from metrics.jsonl, the target tokens of its validation set)."""
    run = Run(run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    loss = [r["val_loss"] for r in records if "val_loss" in r][-1]
    data = build(DataConfig, run.config()["data"], "data")
    batches = build_val_batches(data, run.tokenizer(), 1, 100000)  # the trainer's call, with the run's settings
    return loss, sum(int(b.targets.numel()) for b in batches)


def test_ppl_scores_the_windows_the_trainer_held_out(held_out_run, tmp_path, capsys):
    loss, tokens = trainer_val(held_out_run)
    main([f"run={held_out_run}", f"out={tmp_path / 'held'}"])
    res = json.loads((tmp_path / "held" / "ppl.json").read_text())["sources"]["hamlet"]
    assert res["tokens"] == tokens
    assert res["loss"] == pytest.approx(loss, abs=1e-5)
    assert "held-out windows of hamlet (data.val_fraction=0.05)" in capsys.readouterr().err
    main([f"run={held_out_run}", "whole=true", f"out={tmp_path / 'whole'}"])  # the whole book: an explicit choice
    whole = json.loads((tmp_path / "whole" / "ppl.json").read_text())["sources"]["hamlet"]
    assert whole["tokens"] > 10 * tokens and "every document of hamlet (whole=true" in capsys.readouterr().err


def test_max_tokens_takes_whole_held_out_windows(held_out_run, tmp_path):
    main([f"run={held_out_run}", "max_tokens=640", f"out={tmp_path}"])
    assert json.loads((tmp_path / "ppl.json").read_text())["sources"]["hamlet"]["tokens"] == 640  # 10 windows of 64


def test_generate_stdout_is_only_the_text_and_quotes_are_hydras(held_out_run):
    """A ZeRO-1 run's weights come back through DeepSpeed's zero_to_fp32, which prints; stdout holds the prompt and
    its continuation alone. "prompt='...'" (the shell keeps quotes inside a quoted argument) is the text inside."""
    from diffllm.eval.generate import generate

    prompt = "Anne Elliot was"
    _, model, tok = Run(held_out_run).model()
    want = prompt + generate(model, tok, prompt, max_new_tokens=8)["text"] + "\n"
    for cache in (held_out_run / "eval").glob("fp32-*.pt"):
        cache.unlink()  # the weights are gathered again, and DeepSpeed prints
    got = cli("generate", f"run={held_out_run}", f"prompt='{prompt}'", "max_new_tokens=8")
    assert got.returncode == 0 and got.stdout == want, got.stderr
    assert "zero checkpoint" in got.stderr  # DeepSpeed's chatter is not lost, only moved
    got = cli("generate", f"run={held_out_run}", f'prompt="{prompt}"', "max_new_tokens=8")
    assert got.stdout == want
    assert "zero checkpoint" not in got.stderr  # the second time from the cache (eval/fp32-step<N>.pt)


def test_an_eval_commands_stdout_has_no_deepspeed_line(held_out_run, tmp_path):
    got = cli("eval", "outliers", f"run={held_out_run}", "tokens=256", "bits=[4]", "cloze_items=4", f"out={tmp_path}")
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("| activation |") and "checkpoint" not in got.stdout and "deepspeed" not in got.stdout


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_exports_stdout_has_no_deepspeed_line(held_out_run, tmp_path):
    """Without DS_ACCELERATOR, importing DeepSpeed (to gather a ZeRO-1 checkpoint) logs "Setting accelerator to CPU"
    to stdout: it goes to stderr, and stdout is export's three lines."""
    got = cli("export", f"run={held_out_run}", f"out={tmp_path / 'hf'}", unset=("DS_ACCELERATOR",))
    assert got.returncode == 0, got.stderr
    assert [line.split()[0] for line in got.stdout.splitlines()] == ["format", "wrote", "load"], got.stdout
    assert "Setting accelerator to CPU" in got.stderr


def test_the_gathered_fp32_weights_are_cached_per_checkpoint(held_out_run, tmp_path, capsys):
    """A ZeRO-1 checkpoint's weights are gathered by zero_to_fp32 once, then read from <run>/eval/fp32-<tag>.pt; a
    checkpoint whose files change (saved again under the same tag) is gathered again."""
    import os
    import shutil

    import torch

    run = tmp_path / "run"
    shutil.copytree(held_out_run, run, ignore=shutil.ignore_patterns("eval"))
    _, first, _ = Run(run).model()
    err = capsys.readouterr().err
    tag = Run(run).latest().tag
    assert "Processing zero checkpoint" in err and f"cached the fp32 weights of {tag}" in err
    assert [p.name for p in (run / "eval").iterdir()] == [f"fp32-{tag}.pt"]  # written aside, then renamed
    _, again, _ = Run(run).model()
    assert "Processing zero checkpoint" not in capsys.readouterr().err
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    shard = next((run / "checkpoints" / tag).glob("*optim_states.pt"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # saved again
    Run(run).model()
    assert "Processing zero checkpoint" in capsys.readouterr().err
