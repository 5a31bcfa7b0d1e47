"""`diffllm launch --nodes 1 --procs 2` for real on CPU: two gloo ranks train a micro model to a finished summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffllm.train.dist import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_launch_two_processes_on_cpu(tmp_path, launcher):
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffllm.cli",
            "launch",
            "--launcher",
            launcher,
            "--nodes",
            "1",
            "--procs",
            "2",
            "--master-port",
            str(free_port()),
            "model=transformer-micro-1",
            "data.tokenizer.vocab_size=1024",
            "data.seq_len=64",
            "trainer.tokens=8192",
            "trainer.global_batch_tokens=2048",
            "trainer.micro_batch_size=8",
            "trainer.zero_stage=2",
            "trainer.val_batches=2",
            "trainer.log_every=1",
            "logging.wandb=disabled",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    first = out.stdout.splitlines()[0]
    assert ("--nproc_per_node 2" if launcher == "torchrun" else "--num_gpus 2") in first  # the command it ran
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], summary["tokens"]) == ("finished", 2, 8192)
