"""The environment `diffllm launch` hands DeepSpeed's runner for the other nodes: what is inherited, what is never
inherited (credentials), and the order in which the user's .deepspeed_env files and `--env` win."""

from __future__ import annotations

from diffllm.launch.remote_env import remote_env, write_env_file


def test_inherited_names_files_then_explicit(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\nOMP_NUM_THREADS=4\nA=from-home\n")
    (work / ".deepspeed_env").write_text("A=from-cwd\n\nB=x=y\n")  # DeepSpeed reads both; ./ wins
    launching = {
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": "/data/hf",
        "HF_TOKEN": "hf_secret",
        "WANDB_API_KEY": "k",
        "WANDB_MODE": "offline",
        "DIFFLLM_CACHE": "/c",
        "HOME": str(home),
        "CUDA_VISIBLE_DEVICES": "0",
        "DS_ACCELERATORS": "no",
        "PATH": "/bin",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_TOKEN_PATH": "/t",
        "DIFFLLM_SECRET": "s",
    }
    env = remote_env(launching, {"WANDB_MODE": "disabled", "SEED": 7})
    assert env == {
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "4",
        "HF_HOME": "/data/hf",
        "WANDB_MODE": "disabled",
        "DIFFLLM_CACHE": "/c",
        "TOKENIZERS_PARALLELISM": "false",
        "NCCL_IB_DISABLE": "1",
        "A": "from-cwd",
        "B": "x=y",
        "SEED": "7",
    }


def test_ds_env_file_names_the_users_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.env").write_text("X=1\n")
    assert remote_env({"DS_ENV_FILE": "mine.env"}, {}) == {"X": "1"}


def test_the_file_deepspeed_reads(tmp_path):
    """DeepSpeed splits every line at its first '=' (a blank line would stop it); the file is this user's only."""
    path = write_env_file({"A": "1", "B": "two words", "C": "x=y"})
    try:
        assert [ln.split("=", 1) for ln in path.read_text().splitlines()] == [
            ["A", "1"],
            ["B", "two words"],
            ["C", "x=y"],
        ]
        assert path.stat().st_mode & 0o077 == 0
    finally:
        path.unlink()
