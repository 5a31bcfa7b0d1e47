"""Bad input to the commands that read a trained run (generate, eval, export): one line on stderr naming the culprit,
exit code 2, and found before the checkpoint's weights are gathered."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.distributed import REPO, base_env


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", *argv],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "command",
    [("generate", "prompt=ROMEO:", "max_new_tokens=2"), ("eval", "ppl", "max_tokens=64"), ("export", "out={tmp}/hf")],
    ids=lambda c: c[0] if c[0] != "eval" else "eval-ppl",
)
def test_a_damaged_tokenizer_json_is_one_line_naming_it(runs, tmp_path, command):
    run = tmp_path / "run"
    shutil.copytree(runs("diff"), run)
    text = (run / "tokenizer.json").read_text()
    (run / "tokenizer.json").write_text(text[: len(text) // 2])  # cut short, as by a full disk
    got = cli(*[a.format(tmp=tmp_path) for a in command], f"run={run}")
    assert got.returncode == 2 and got.stdout == ""
    (line,) = got.stderr.splitlines()
    assert line.startswith(f"diffllm {' '.join(command[:2]) if command[0] == 'eval' else command[0]}: error: {run}")
    assert f"{run / 'tokenizer.json'}: cannot load this tokenizer (Exception: EOF while parsing" in line
    assert line.endswith("the file is damaged")
