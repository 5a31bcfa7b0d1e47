"""Packaging beyond pyproject.toml: the top-level configs/ folder (the source of truth) ships inside the package as
diffllm/configs, so a wheel install finds its configs (diffllm/config/loading.py: CONFIG_DIR)."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["diffllm", "diffllm.*"]) + ["diffllm.configs"],
    package_dir={"diffllm.configs": "configs"},
    package_data={"diffllm.configs": ["*.yaml", "**/*.yaml"],
                  "diffllm.eval": ["tasks/*/*.yaml", "tasks/*/*.jsonl"]},  # lm-eval's local tasks
)
