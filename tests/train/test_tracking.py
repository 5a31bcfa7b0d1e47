"""W&B with a key but no network (a compute node): the online start gives up fast and logs offline, same run id."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.distributed import free_port

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from diffllm.train.config import LoggingConfig
    from diffllm.train.tracking import open_wandb
    run = open_wandb(LoggingConfig(online_timeout_s=float(sys.argv[2])), Path(sys.argv[1]), "abcd1234", {"seed": 1})
    run.log({"loss": 1.5}, step=1)
    print(json.dumps({"id": run.id, "offline": run.settings._offline}), flush=True)
    run.finish()
""")


def open_offline(tmp_path, base_url: str, timeout_s: float, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_API_KEY="x" * 40, WANDB_BASE_URL=base_url, HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path))
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run"), str(timeout_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )  # the old fallback took 90 s, then crashed


@pytest.mark.slow
def test_key_without_network_logs_offline_with_the_same_run_id(tmp_path):
    done = open_offline(tmp_path, f"http://127.0.0.1:{free_port()}", 20.0)  # a closed port: connection refused
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"id": "abcd1234", "offline": True}
    assert "is not reachable; logging offline" in done.stderr
    assert [p.name.rsplit("-", 1)[1] for p in (tmp_path / "run" / "wandb").glob("offline-run-*")] == ["abcd1234"]


@pytest.mark.slow
def test_a_server_that_never_answers_times_out_then_logs_offline(tmp_path):
    """The port accepts connections but nothing answers: wandb.init gives up after logging.online_timeout_s, and the
    offline start that follows is not refused as `run ID ... is in use`."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        # wandb's own analytics would wait ~20 s at exit to flush to the silent server (docs/training.md): not the
        # subject here, so switched off the way a user can
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        done = open_offline(tmp_path, url, 5.0, WANDB_ERROR_REPORTING="false")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"id": "abcd1234", "offline": True}
    assert "the online start failed" in done.stderr
