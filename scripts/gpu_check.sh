#!/usr/bin/env bash
# The prepared GPU check (one H200 run, < 8 minutes, installs nothing): backend agreement and Transformer vs Diff
# throughput/MFU. Run from the repo root on a machine with CUDA torch and PyYAML: `bash scripts/gpu_check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 450 python3 scripts/gpu_check.py
