"""`data=<name>` (any group) finds configs/<group>/<name>.yaml in $DIFFLLM_CONFIG_PATH, --config-dir or ./configs
before the packaged ones; `diffllm sweep --config-dir` hands the directory on to its jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffllm.config import CONFIG_DIR, compose, search_path

REPO = Path(__file__).resolve().parents[2]


def user_configs(root: Path, seq_len: int = 64, name: str = "mine") -> Path:
    """<root>/data/<name>.yaml: the packaged Shakespeare config under another name and sequence length."""
    text = (CONFIG_DIR / "data" / "shakespeare.yaml").read_text()
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / f"{name}.yaml").write_text(
        text.replace("name: shakespeare", f"name: {name}").replace("seq_len: 256", f"seq_len: {seq_len}")
    )
    return root


def test_dot_configs_of_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("DIFFLLM_CONFIG_PATH", raising=False)
    user_configs(tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    assert search_path() == [(tmp_path / "configs").resolve(), CONFIG_DIR.resolve()]
    cfg = compose("tokenizer", ["data=mine"])
    assert (cfg.data.name, cfg.data.seq_len) == ("mine", 64)
    assert compose("train", ["data=mine", "model=diff-tiny"]).data.name == "mine"  # packaged groups still there


def test_env_path_comes_first_and_shadows(tmp_path, monkeypatch):
    user_configs(tmp_path / "a", seq_len=32)
    user_configs(tmp_path / "b", seq_len=48)
    user_configs(tmp_path / "b", seq_len=16, name="shakespeare")  # shadows the packaged one
    monkeypatch.setenv("DIFFLLM_CONFIG_PATH", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.chdir(tmp_path)
    assert compose("tokenizer", ["data=mine"]).data.seq_len == 32
    assert compose("tokenizer").data.seq_len == 16


def test_config_dir_option_and_help(diffllm, tmp_path, monkeypatch):
    user_configs(tmp_path / "mine_cfg")
    monkeypatch.chdir(tmp_path)
    res = diffllm("data", "prepare", "--config-dir", "mine_cfg", "data=mine", "--cfg", "job")
    assert res.code == 0 and "name: mine" in res.out and "seq_len: 64" in res.out, res.err
    assert os.environ["DIFFLLM_CONFIG_PATH"] == str((tmp_path / "mine_cfg").resolve())  # what child processes see
    monkeypatch.delenv("DIFFLLM_CONFIG_PATH")
    missing = diffllm("data", "prepare", "data=mine")
    assert missing.code == 2 and missing.err.startswith("diffllm data prepare: error: unknown data=mine (")
    help_text = diffllm("data", "prepare", "--help", "--config-dir", "mine_cfg").out
    packaged = len(list((CONFIG_DIR / "data").glob("*.yaml")))
    assert f"data=shakespeare   ({packaged + 1} options)" in help_text  # the packaged data configs and mine
    assert str((tmp_path / "mine_cfg").resolve()) in help_text


def run_sweep(cfg_dir: Path, tmp_path: Path, sweep_dir: Path) -> subprocess.CompletedProcess:
    """`diffllm sweep --config-dir <cfg_dir> sweep=mine` from a directory that has no configs of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("DIFFLLM_CONFIG_PATH", "HYDRA_FULL_ERROR")}
    cmd = [sys.executable, "-m", "diffllm.cli", "sweep", "--config-dir", str(cfg_dir), "sweep=mine"]
    return subprocess.run(
        [*cmd, f"sweep_dir={sweep_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHONPATH": str(REPO)},
    )


def sweep_configs(root: Path, seq_len: int) -> Path:
    """<root>/sweep/mine.yaml, a one-run grid whose runs name data=mine, beside <root>/data/mine.yaml."""
    cfg_dir = user_configs(root, seq_len=seq_len)
    (cfg_dir / "sweep").mkdir()
    (cfg_dir / "sweep" / "mine.yaml").write_text(
        "name: mine\nmodels: [diff-tiny]\ntokens: [4096]\noverrides: [data=mine, logging.wandb=disabled]\n"
    )
    return cfg_dir


def test_sweep_checks_its_jobs_with_the_config_dir_before_queueing(tmp_path):
    """The grid and the data config its runs name live in the user's directory; the data config is deliberately
    invalid (seq_len 0). The sweep composes each job with that directory, so it rejects the job by name before
    anything is queued (before: `Could not find 'data/mine'`)."""
    cfg_dir = sweep_configs(tmp_path / "my_configs", seq_len=0)
    done = run_sweep(cfg_dir, tmp_path, tmp_path / "sweep")
    assert "Could not find" not in done.stderr
    job = tmp_path / "sweep" / "diff-tiny" / "4096" / "seed1234"
    assert done.returncode == 2 and done.stderr == (
        f"diffllm sweep: error: the job of {job}: data.seq_len: must be >= 1, got 0\n"
    ), done.stderr
    assert not job.exists()


@pytest.mark.slow
def test_sweep_config_dir_reaches_the_jobs(tmp_path):
    """A valid data config in the user's directory (seq_len 32, not the packaged 256): the job itself, a separate
    process started by the sweep, must find it, so its run's config.yaml carries it."""
    cfg_dir = sweep_configs(tmp_path / "my_configs", seq_len=32)
    done = run_sweep(cfg_dir, tmp_path, tmp_path / "sweep")
    assert done.returncode == 0, done.stderr
    saved = (tmp_path / "sweep" / "diff-tiny" / "4096" / "seed1234" / "config.yaml").read_text()
    assert "name: mine" in saved and "seq_len: 32" in saved
    # the printed multirun command carries the directory too, so it can be rerun by hand
    assert f"DIFFLLM_CONFIG_PATH={cfg_dir} " in done.stdout and "-m diffllm.sweep.job --multirun" in done.stdout


def test_an_option_named_like_a_number_is_the_options_name(diffllm, tmp_path, monkeypatch):
    """`sweep=2024` names configs/sweep/2024.yaml (before: Hydra typed it an int and raised a ValueError traceback);
    a missing numeric option is the usual one line with its nearest names."""
    cfg_dir = sweep_configs(tmp_path / "my_configs", seq_len=64)
    grid = (cfg_dir / "sweep" / "mine.yaml").read_text()
    (cfg_dir / "sweep" / "2024.yaml").write_text(grid.replace("name: mine", "name: n2024"))
    monkeypatch.chdir(tmp_path)
    res = diffllm("sweep", "--config-dir", str(cfg_dir), "sweep=2024", "dry_run=true", f"sweep_dir={tmp_path}/s")
    assert res.code == 0 and f"{tmp_path}/s/diff-tiny" in res.out, res.err
    res = diffllm("sweep", "--config-dir", str(cfg_dir), "sweep=2025", "dry_run=true")
    assert res.code == 2 and res.err.startswith("diffllm sweep: error: unknown sweep=2025 (closest: 2024"), res.err
    assert compose("sweep", ["sweep=2024"]).sweep.name == "n2024"  # the compose() tests and scripts use, too
