"""`diffllm sweep` from the real command line (in this process for dry runs and refusals, a subprocess where jobs
train): every documented launcher in a dry run, a real tiny sweep through the basic launcher, and the config folders
that could hide a command's keys from Hydra (issue 31, defect 1: `launcher=` was read as a choice of the
`configs/launcher/` group of `diffllm launch`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffllm.cli.registry import COMMANDS
from diffllm.config import CONFIG_DIR, compose, config_groups
from diffllm.config.loading import unknown_key
from diffllm.sweep.cli import LAUNCHERS, _importable, job_world_size
from tests.distributed import cli_here
from tests.train.helpers import TINY

REPO = Path(__file__).resolve().parents[2]
SUBMITIT = _importable("hydra_plugins.hydra_submitit_launcher")
# configs/sweep/paper.yaml's header: the paper's grid on a SLURM cluster
PAPER_SLURM = (
    'launcher_overrides=["hydra.launcher.nodes=4","hydra.launcher.gpus_per_node=8",'
    '"hydra.launcher.tasks_per_node=1","hydra.launcher.timeout_min=2880"]'
)
PASSED_ON = " ".join(
    f"hydra.launcher.{kv}" for kv in ("nodes=4", "gpus_per_node=8", "tasks_per_node=1", "timeout_min=2880")
)


def sweep(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "sweep", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_no_command_key_is_hidden_by_a_config_group():
    """A root key of a command's config that is also a folder of configs/ is read by Hydra as a group choice."""
    folders = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()}
    for command in {c.config for c in COMMANDS.values() if c.config}:
        keys = set(compose(command).keys()) - set(config_groups(command))
        assert not keys & folders, f"{command}: keys {sorted(keys & folders)} are also config groups"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_documented_launcher_plans_the_paper_grid(tmp_path, launcher):
    extra = [PAPER_SLURM] if launcher == "submitit_slurm" else []
    out = cli_here("sweep", "sweep=paper", f"launcher={launcher}", *extra, f"sweep_dir={tmp_path}/s", "dry_run=true")
    assert out.returncode == 0, out.stderr
    assert "10 runs: 0 finished (skipped), 10 to run" in out.stdout
    commands = [line for line in out.stdout.splitlines() if "--multirun" in line]
    assert len(commands) == 5  # one per size: its own trainer preset (6.8B and 13.1B at the paper's lr 7.5e-4)
    for size in ("830m", "1.4b", "2.8b", "6.8b", "13.1b"):
        (cmd,) = [c for c in commands if f"model=transformer-{size},diff-{size} " in c]
        assert f"trainer=paper-scaling-{size}" in cmd and ("optim.lr=0.00075" in cmd) is size.endswith(
            ("6.8b", "13.1b")
        )
    for cmd in commands:
        if launcher == "basic":
            assert "hydra/launcher" not in cmd
        else:
            assert cmd.endswith("hydra/launcher=submitit_slurm " + PASSED_ON), cmd
    assert ("needs hydra-submitit-launcher" in out.stderr) is (launcher != "basic" and not SUBMITIT)
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
@pytest.mark.skipif(SUBMITIT, reason="hydra-submitit-launcher is installed: a real run would submit")
def test_submitit_without_its_plugin_is_refused_before_anything_runs(tmp_path):
    out = cli_here("sweep", "sweep=paper", "launcher=submitit_slurm", f"sweep_dir={tmp_path}/s")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        "diffllm sweep: error: launcher=submitit_slurm: needs hydra-submitit-launcher (pip install 'diffllm[slurm]')\n"
    )
    assert not (tmp_path / "s").exists()


def test_a_user_folder_that_hides_a_key_is_named(tmp_path):
    (tmp_path / "configs" / "launcher").mkdir(parents=True)
    (tmp_path / "configs" / "launcher" / "mine.yaml").write_text("nodes: 2\n")
    out = cli_here("sweep", "launcher=basic", "dry_run=true", cwd=tmp_path)  # ./configs is on the search path
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"{tmp_path / 'configs' / 'launcher'} on the config search path makes it a config group" in out.stderr
    assert "did you mean" not in out.stderr


def test_did_you_mean_never_repeats_the_input():
    assert unknown_key("launcher", ["launcher", "launcher_overrides"]) == (
        "unknown key launcher (did you mean launcher_overrides?)"
    )
    assert unknown_key("a.b", ["a.b"]) == "unknown key a.b"
    assert unknown_key("launcherr", ["launcher"]) == "unknown key launcherr (did you mean launcher?)"


TINY_SWEEP = {
    "name": "tiny",
    "models": ["diff-tiny"],
    "tokens": [2048],  # two steps of 1024 tokens
    "seeds": [1],
    "overrides": [a for a in TINY if not a.startswith(("trainer.tokens=", "trainer.save_every_steps="))]
    + ["trainer.zero_stage=0", "trainer.val_every=2", "optim.warmup_steps=1"],
}


@pytest.mark.slow  # 15-30 s: a real job trains
def test_a_tiny_sweep_through_the_basic_launcher(tmp_path, tokenizer):
    (tmp_path / "configs" / "sweep").mkdir(parents=True)
    (tmp_path / "configs" / "sweep" / "tiny.yaml").write_text(yaml.safe_dump(TINY_SWEEP))
    root = tmp_path / "runs"
    out = sweep("--config-dir", str(tmp_path / "configs"), "sweep=tiny", "launcher=basic", f"sweep_dir={root}")
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((root / "diff-tiny" / "2048" / "seed1" / "summary.json").read_text())
    assert (summary["status"], summary["tokens"]) == ("finished", 2048)
    assert sorted(p.name for p in root.iterdir()) == [".multirun", "diff-tiny"]


@pytest.mark.slow
def test_a_run_stopped_early_leaves_no_leaked_semaphores_in_the_sweep_log(tmp_path, tokenizer):
    """A job whose run stops on a non-finite loss (exit 4) with two data workers: the trainer's os._exit skipped the
    garbage collection that frees the DataLoader queues' semaphores, and the resource tracker reported them "leaked"
    in the sweep's log (the log is read to its end, which the tracker holds open until it is done). And the sweep
    exited 0 though its run did not finish."""
    grid = dict(TINY_SWEEP, name="stops")
    grid["overrides"] = [*grid["overrides"], "data.num_workers=2", "trainer.faults.nan_at_steps=[1]"]
    grid["overrides"] += ["trainer.max_nonfinite_in_a_row=1"]
    (tmp_path / "configs" / "sweep").mkdir(parents=True)
    (tmp_path / "configs" / "sweep" / "stops.yaml").write_text(yaml.safe_dump(grid))
    out = sweep("--config-dir", str(tmp_path / "configs"), "sweep=stops", f"sweep_dir={tmp_path / 'runs'}")
    log = out.stdout + out.stderr
    assert "non-finite loss or gradient" in log and "leaked" not in log, log
    assert out.returncode == 1 and out.stderr.endswith(  # the multirun's own exit code was 0
        f"diffllm sweep: 1 of 1 runs did not finish (first: {tmp_path}/runs/diff-tiny/2048/seed1; their logs say "
        f"why); rerun the sweep to resume them\n"
    )


def test_jobs_are_checked_at_their_world_size():
    """basic: one process per job; submitit_slurm: nodes x GPUs per node (what the job's torchrun starts)."""
    slurm = ["hydra.launcher.nodes=4", "hydra.launcher.gpus_per_node=8", "hydra.launcher.timeout_min=60"]
    assert job_world_size("basic", slurm) == 1 and job_world_size("submitit_slurm", slurm) == 32
    assert job_world_size("submitit_slurm", ["hydra.launcher.gpus_per_node=null"]) == 1
