"""`diffllm launch --nodes 1 --procs 2` for real on CPU: two gloo ranks train a micro model to a finished summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import free_port

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
            "trainer.val_tokens=4096",  # the final validation: a share of the held-out plays, for speed
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


WORKER = """import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *a: (out.with_name("saved").write_text("3"), sys.exit(3)))
out.write_text("up")
time.sleep(600)
"""


@pytest.mark.slow
def test_torchrun_exits_1_when_sigterm_stopped_its_workers(tmp_path):
    """What docs/training.md and docs/launch.md say of bare torchrun: it forwards SIGTERM, the worker's own exit
    (3, after its save) is not passed on, torchrun exits 1 with a SignalException of its own."""
    (tmp_path / "worker.py").write_text(WORKER)
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "1", "--rdzv_backend", "c10d"]
    cmd += ["--rdzv_endpoint", "localhost:0", "--signals_to_handle", "SIGTERM,SIGINT"]  # 0: a port the OS picks
    cmd += [str(tmp_path / "worker.py"), str(tmp_path / "up")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # the worker is up (at most 120 s; a slow machine starts torchrun slowly)
            if (tmp_path / "up").exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert (tmp_path / "up").exists(), proc.stderr.read() if proc.poll() is not None else "no worker"
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1 and (tmp_path / "saved").read_text() == "3"
    assert "SignalException: Process" in err and "got signal: 15" in err
