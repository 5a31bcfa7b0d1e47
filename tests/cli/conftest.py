"""CLI-test helpers: run `diffllm ...` in this process (its output, error output and exit code), from a given folder."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from diffllm.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def diffllm(capsys, monkeypatch):
    """diffllm("train", "--help") -> Result; sys.argv and the environment are restored afterwards."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    for name in ("DIFFLLM_CONFIG_PATH", "HYDRA_FULL_ERROR"):  # `--config-dir` writes the first into os.environ
        monkeypatch.setenv(name, "")  # recorded (an unset variable's delenv is not), so teardown undoes any change
        monkeypatch.delenv(name)

    def run(*argv: str) -> Result:
        capsys.readouterr()
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run
