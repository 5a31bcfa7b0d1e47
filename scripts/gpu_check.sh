#!/usr/bin/env bash
# The prepared GPU check (one H200 run, < 9 minutes, installs nothing): backend agreement and Transformer vs Diff
# throughput/MFU (gpu_check.py), document masks: flash varlen and Diff's Triton kernel vs sdpa with the dense mask
# (gpu_check_docmask.py), then the Diff attention backends incl. the Triton kernel (gpu_bench_attention.py: one
# table). Run from the repo root on a machine with CUDA torch, PyYAML and triton: `bash scripts/gpu_check.sh`.
# `GPU_CHECK_SMOKE=1 bash scripts/gpu_check.sh` runs the same code on CPU with tiny models.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 150 python3 scripts/gpu_check.py || echo "gpu_check.py: exit $? (timeout 150 s); going on"
timeout 90 python3 scripts/gpu_check_docmask.py || echo "gpu_check_docmask.py: exit $? (timeout 90 s); going on"
GPU_BENCH_BUDGET_S="${GPU_BENCH_BUDGET_S:-240}" timeout 300 python3 scripts/gpu_bench_attention.py
