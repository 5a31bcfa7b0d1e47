"""A full disk during a checkpoint save (issue 56): a run directory on a 4 MiB tmpfs, where the step-2 checkpoint
(about 2.7 MiB) fits and the step-4 one does not. It was a 76-line traceback ending in torch's "unexpected pos ..."
(or "basic_ios::clear: iostream error"), exit 1, with tmp-step4 left behind. Now: one line naming the folder and the
free space, exit 2, tmp-step4 removed, and step 2 still the intact checkpoint `latest` names.

The tmpfs is mounted in a mount namespace of its own (`unshare --mount`, with a user namespace when not root), by a
helper that runs the training there and reports what it left; the fault is the real one, no write is faked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.distributed import REPO, base_env
from tests.train.helpers import TINY

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs, unshare")]
ARGS = [a for a in TINY if not a.startswith(("trainer.tokens=", "trainer.save_every_steps=", "optim.warmup"))] + [
    "trainer.tokens=4096",  # 4 steps
    "trainer.save_every_steps=2",
    "optim.warmup_steps=2",
    "trainer.zero_stage=0",
]
HELPER = """
import json, os, subprocess, sys
from pathlib import Path

disk, report = Path(sys.argv[1]), Path(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
run = disk / "run"
done = subprocess.run(sys.argv[3:] + [f"run_dir={run}"], capture_output=True, text=True)
from diffllm.runs import Run

ckpt = Run(run).checkpoint()  # what `latest` names, loaded back (weights and training state)
_, model, _ = Run(run).model(tokenizer=False)
state = ckpt.client_state()["diffllm"]["train_state"]
report.write_text(json.dumps({
    "code": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "run": str(run),
    "files": sorted(str(p.relative_to(run)) for p in run.rglob("*")),
    "latest": ckpt.tag, "step": state["step"], "params": sum(p.numel() for p in model.parameters()),
}))
"""


def namespace() -> list[str]:
    """The unshare command that gives a process its own mount namespace (skip where there is none)."""
    cmd = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    if shutil.which("unshare") is None or subprocess.run([*cmd, "true"], capture_output=True).returncode:
        pytest.skip("no mount namespace for a small tmpfs here (unshare --mount failed)")
    return cmd


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(tokenizer, tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "helper.py").write_text(HELPER)
    train = [sys.executable, "-m", "diffllm.cli", "train", *ARGS]
    cmd = [*namespace(), sys.executable, str(tmp_path / "helper.py"), str(tmp_path / "disk"), str(tmp_path / "report")]
    helper = subprocess.run(cmd + train, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=600)
    assert helper.returncode == 0, helper.stderr[-3000:]
    r = json.loads((tmp_path / "report").read_text())
    assert r["code"] == 2, r["stdout"][-2000:] + r["stderr"][-3000:]
    assert "Traceback" not in r["stderr"], r["stderr"]
    errors = [line for line in r["stderr"].splitlines() if "error" in line]
    assert len(errors) == 1, r["stderr"]
    run = r["run"]
    assert errors[0].startswith(
        f"diffllm train: error: checkpoint: cannot save step 4 in {run}/checkpoints/tmp-step4: No space left on "
        f"device ("
    ), errors[0]
    assert "free of 4.0 MiB); removed it, and the last checkpoint " in errors[0], errors[0]
    assert f"{run}/checkpoints/step2 is intact" in errors[0], errors[0]
    assert (r["latest"], r["step"], r["params"]) == ("step2", 2, 229632)  # the previous checkpoint loads whole
    ckpts = [f for f in r["files"] if f.startswith("checkpoints/")]
    assert not [f for f in ckpts if "tmp-" in f or "/." in f], ckpts  # no tmp-step4, no file written aside
    assert "lock.json" not in r["files"] and "checkpoints/step2/meta.json" in ckpts, r["files"]
