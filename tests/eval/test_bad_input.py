"""Bad input to the commands that read a trained run (generate, eval, export): one line on stderr naming the culprit,
exit code 2, and found before the checkpoint's weights are gathered."""

from __future__ import annotations

import shutil

import pytest

from tests.distributed import REPO, cli_here


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
    got = cli_here(*[a.format(tmp=tmp_path) for a in command], f"run={run}")
    assert got.returncode == 2 and got.stdout == ""
    (line,) = got.stderr.splitlines()
    assert line.startswith(f"diffllm {' '.join(command[:2]) if command[0] == 'eval' else command[0]}: error: {run}")
    assert f"{run / 'tokenizer.json'}: not a readable tokenizer.json (EOF while parsing" in line


@pytest.mark.parametrize(
    "argv, error",
    [
        (("generate", "prompt=ROMEO:", "temperature=-1"), "temperature=-1.0: must be >= 0 (0 is greedy)"),
        (("generate", "prompt=ROMEO:", "top_p=2"), "top_p=2.0: must be in (0, 1]"),
        (("eval", "ppl", "data=nowhere/*.txt"), "data.val[0].path: {cwd}/nowhere/*.txt: no files match"),
        (("eval", "outliers", "seq_len=4096"), "seq_len=4096: longer than the model's context (128)"),
        (("eval", "needle", "lengths=[4096]"), "lengths: 4096 exceeds the model's context (128)"),
    ],
    ids=["temperature", "top_p", "ppl-data-glob", "outliers-seq_len", "needle-lengths"],
)
def test_arguments_are_checked_before_the_weights_are_read(runs, tmp_path, argv, error):
    """The checkpoint's weights are damaged here: had they been read first, that would be the error reported."""

    run = tmp_path / "run"
    shutil.copytree(runs("diff"), run, ignore=shutil.ignore_patterns("eval"))
    for states in (run / "checkpoints").glob("step*/*model_states.pt"):
        states.write_bytes(states.read_bytes()[:100])
    got = cli_here(*argv, f"run={run}")
    assert got.returncode == 2 and got.stdout == ""
    command = " ".join(a for a in argv if "=" not in a)
    assert got.stderr.splitlines() == [f"diffllm {command}: error: {error.format(cwd=REPO)}"]
