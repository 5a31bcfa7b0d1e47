"""`pip install .` (not editable) works: the wheel carries configs/ as diffllm/configs, and `diffllm info` runs from it
in a fresh venv, from a folder where the repository is not on sys.path. Offline: the fresh venv reaches the running
environment's installed dependencies through a .pth line (which does not process that environment's editable hook,
so the only diffllm it can import is the wheel's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(argv: list, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_wheel_ships_configs_and_runs_info(tmp_path):
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and *.egg-info behind
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("diffllm", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", src]
    )
    (wheel,) = (tmp_path / "dist").glob("diffllm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"diffllm/configs/{p.relative_to(REPO / 'configs')}" for p in (REPO / "configs").rglob("*.yaml")}
    assert shipped <= names and "diffllm/configs/train.yaml" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel])

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DIFFLLM_CONFIGS", "DIFFLLM_CONFIG_PATH")}
    where = _run([py, "-c", "import diffllm.config as c; print(c.__file__); print(c.CONFIG_DIR)"], cwd=work, env=env)
    assert where.stdout.splitlines() == [f"{site}/diffllm/config/__init__.py", f"{site}/diffllm/configs"]
    info = _run([venv / "bin" / "diffllm", "info", "model=diff-3b"], cwd=work, env=env)
    assert (
        info.stdout.startswith("preset               diff-3b (diff: Diff Transformer)\n")
        and "parameters           " in info.stdout
    )
    assert "usage: diffllm info" in _run([venv / "bin" / "diffllm", "info", "--help"], cwd=work, env=env).stdout
