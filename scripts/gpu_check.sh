#!/usr/bin/env bash
# The GPU check on the lent machine's image (docs/gpu.md). It needs only what it carries: $GPU_CHECK_CARRY (default
# .gpu-check/, built by `make gpu-wheels`) holds the wheels of what the image lacks (installed into $GPU_CHECK_SITE,
# never into the image's own environment) and the tokenized Shakespeare plays. Parts, each under a hard time limit
# (SIGKILL: a hang costs its limit, no more; 360 s in all):
#   nvidia-smi (10 s) | install (30 s) | gpu_check_trainer.py (190 s): a checkpoint save + resume, then per arch the
#   trainer's step loop at 1.4B (DeepSpeed ZeRO-2, bf16, NCCL, trainer=paper-scaling, the real loader) beside the bare
#   fwd+bwd loop and the planner | gpu_check.py agreement (25 s) | gpu_check_docmask.py (35 s) |
#   gpu_bench_attention.py (55 s) | the table (10 s).
# Every part appends its rows to $GPU_CHECK_OUT/results.jsonl ($OUT on the lent machine, else /tmp/gpu-check), and
# one table of them all is printed last. Exit 0 when every part exited 0.
# `GPU_CHECK_SMOKE=1 bash scripts/gpu_check.sh` runs the same code on CPU (gloo, fp32, tiny presets, a few steps);
# GPU_CHECK_TIME_SCALE=N multiplies every limit (a loaded CPU machine needs more than a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
GPU_CHECK_CARRY=$(realpath "${GPU_CHECK_CARRY:-.gpu-check}")
if [ ! -d "$GPU_CHECK_CARRY/wheels" ] || [ ! -d "$GPU_CHECK_CARRY/data" ]; then
  echo "gpu_check.sh: no carried folder $GPU_CHECK_CARRY (wheels/, data/): run \`make gpu-wheels\` and carry it" >&2
  exit 2
fi
GPU_CHECK_OUT=${GPU_CHECK_OUT:-${OUT:-/tmp/gpu-check}}
SITE=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
export GPU_CHECK_CARRY GPU_CHECK_OUT
# smoke: one thread per process (torch's default of one per core crawls on a shared CPU: 10x slower steps, measured)
[ "${GPU_CHECK_SMOKE:-0}" = 1 ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$GPU_CHECK_OUT"
rm -f "$GPU_CHECK_OUT/results.jsonl"
exec > >(tee "$GPU_CHECK_OUT/log.txt") 2>&1
failed=0
scale=${GPU_CHECK_TIME_SCALE:-1}

# part NAME LIMIT_S COMMAND...: run it under its limit, add its status row
part() {
  local name=$1 limit=$(($2 * scale)) t0=$SECONDS rc
  shift 2
  echo "== $name (limit $limit s)"
  timeout -s KILL "$limit" "$@"
  rc=$?
  local what="exit $rc"
  [ "$rc" = 137 ] && what="killed at its limit"
  [ "$rc" = 0 ] || failed=1
  printf '{"part": "status", "model": "%s", "setting": "limit %s s", "result": "%s after %s s"}\n' \
    "$name" "$limit" "$what" "$((SECONDS - t0))" >>"$GPU_CHECK_OUT/results.jsonl"
  return "$rc"
}

[ "${GPU_CHECK_SMOKE:-0}" = 1 ] || timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
part install 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$GPU_CHECK_CARRY"/wheels/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
GPU_CHECK_TRAINER_BUDGET_S=${GPU_CHECK_TRAINER_BUDGET_S:-$((165 * scale))} part trainer 190 python3 scripts/gpu_check_trainer.py
part agreement 25 python3 scripts/gpu_check.py agreement
part doc-masks 35 python3 scripts/gpu_check_docmask.py
GPU_BENCH_BUDGET_S=${GPU_BENCH_BUDGET_S:-20} part diff-attention 55 python3 scripts/gpu_bench_attention.py
timeout $((10 * scale)) python3 scripts/gpu_check.py table || failed=1
exit "$failed"
