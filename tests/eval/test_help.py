"""An eval command's --help imports its module (for the typed config its keys come from): the modules of generate,
eval ppl, eval compare and eval lm-eval import neither torch nor numpy at import time, so their help answers at once
(it took 7-9 s on a loaded machine when they did). What their commands run imports them where it is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.distributed import REPO, base_env

PROBE = """
import contextlib, io, sys
from diffllm.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    main({argv!r})
assert "keys (key=default)" in out.getvalue(), out.getvalue()
print(sorted(m for m in ("torch", "numpy", "deepspeed", "transformers", "matplotlib") if m in sys.modules))
"""


@pytest.mark.parametrize("command", ["generate", "eval ppl", "eval compare", "eval lm-eval"])
def test_help_imports_no_torch_or_numpy(command):
    got = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=command.split() + ["--help"])],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"
