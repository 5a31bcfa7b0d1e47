"""`diffllm tokenizer train` and `diffllm data prepare` as a user runs them (real processes, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import cli_here

from .helpers import corpus

DIFFLLM = [sys.executable, "-m", "diffllm.cli"]


def run(args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "DIFFLLM_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(DIFFLLM + args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_tokenizer_train_then_prepare(tmp_path):
    corpus(tmp_path / "c", n_files=3, docs_per_file=60)
    corpus(tmp_path / "v", n_files=1, docs_per_file=20, tag="v")
    data = [
        f"data.sources=[{{name:c,path:'{tmp_path}/c/*.jsonl'}}]",
        f"data.val=[{{name:v,path:'{tmp_path}/v/*.jsonl'}}]",
        "data.tokenizer.vocab_size=300",
    ]
    out = run(["tokenizer", "train", *data, f"out={tmp_path}/tok/tokenizer.json"], tmp_path)
    assert (
        "vocab                300" in out and "encode throughput" in out and (tmp_path / "tok/tokenizer.json").exists()
    )
    out = run(
        ["data", "prepare", *data, f"data.tokenizer.path={tmp_path}/tok/tokenizer.json", f"out={tmp_path}/prep"],
        tmp_path,
    )
    assert "| c | 3 | 180 | 0 | 0 |" in out and "| v | 1 | 20 | 0 | 0 |" in out
    meta = json.loads((tmp_path / "prep/c/meta.json").read_text())
    assert meta["docs"] == 180 and meta["files"] == ["part-00.jsonl", "part-01.jsonl", "part-02.jsonl"]


@pytest.mark.slow
def test_bad_source_is_one_line(tmp_path):
    out = cli_here(
        "tokenizer", "train", f"data.sources=[{{path:'{tmp_path}/none/*.jsonl'}}]", env={"DIFFLLM_CACHE": str(tmp_path)}
    )
    assert out.returncode == 2 and out.stderr.strip() == (
        f"diffllm tokenizer train: error: data.sources[0].path: {tmp_path}/none/*.jsonl: no files match"
    )


@pytest.mark.slow
def test_skipped_bad_records_are_counted_in_the_log_and_summary(tmp_path):
    """`diffllm train data.on_bad_record=skip` over a shard with two malformed lines: the run finishes, its log names
    the first bad line, and summary.json counts both (each once, whichever stream read it)."""
    from tests.distributed import run_train
    from tests.train.helpers import tiny

    corpus(tmp_path / "c", n_files=1, docs_per_file=100)
    corpus(tmp_path / "v", n_files=1, docs_per_file=20, tag="v")
    shard = tmp_path / "c" / "part-00.jsonl"
    lines = shard.read_text().splitlines()  # bad lines 1 and 3: counted with the first two documents
    shard.write_text("\n".join(['{"text": "cut sh', lines[0], "not json"] + lines[1:]) + "\n")
    data = [
        f"data.sources=[{{name:c,path:'{tmp_path}/c/*.jsonl'}}]",
        f"data.val=[{{name:v,path:'{tmp_path}/v/*.jsonl'}}]",
        "data.on_bad_record=skip",
        "trainer.tokens=2048",
    ]
    env = {"DIFFLLM_CACHE": str(tmp_path / "cache")}
    run = run_train(tiny(tmp_path / "run", 0, *data), 1, tmp_path / "logs", env=env, launcher="plain")
    out = run.output(0)
    assert f"{shard}:1: not valid JSON (Unterminated string" in out, out[-3000:]
    assert "data: 2 malformed records skipped (data.on_bad_record=skip)" in out, out[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["bad_records"] == 2
