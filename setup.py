"""Packaging beyond pyproject.toml: the top-level configs/ folder (the source of truth) ships inside the package as
diffllm/configs, so a wheel install finds its configs (diffllm/config/loading.py: CONFIG_DIR); lm-eval's local tasks
ship in diffllm/eval/tasks. Their folders hold data files only, so each is listed as a package of its own (setuptools
warns about every data folder that is not)."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent


def data_packages(root: Path, package: str) -> list[str]:
    """`package` and one dotted package per folder below `root` (which holds its files)."""
    return [package] + sorted(f"{package}.{'.'.join(d.relative_to(root).parts)}" for d in root.rglob("*")
                              if d.is_dir() and d.name != "__pycache__")


CONFIGS = data_packages(HERE / "configs", "diffllm.configs")
TASKS = data_packages(HERE / "diffllm" / "eval" / "tasks", "diffllm.eval.tasks")

setup(
    packages=sorted(set(find_packages(include=["diffllm", "diffllm.*"]) + CONFIGS + TASKS)),
    package_dir={"diffllm.configs": "configs"},
    package_data={**{p: ["*.yaml"] for p in CONFIGS}, **{p: ["*.yaml", "*.jsonl"] for p in TASKS}},
)
