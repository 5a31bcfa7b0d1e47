"""The lent GPU machine's Python image, simulated on CPU: a fresh Python 3.12 venv holding the image's torch (2.11.0,
the CUDA 13 wheel: it imports and runs on a CPU) and the image's other packages that diffllm's trainer uses, and a
sitecustomize whose import blocker refuses every module of a package the image lacks (the ones this venv, the dev
venv, holds beside the image's list: omegaconf, hydra, deepspeed, datasets, wandb, pydantic, ...), unless it comes
from a directory named in $DIFFLLM_IMAGE_SIM_ALLOW (where the GPU check installs the wheels it carries).

Built once per machine under $DIFFLLM_IMAGE_SIM (default ~/.cache/diffllm/image-sim/<key of what it holds>): about
2-3 minutes and 4.7 GiB (torch's CUDA wheel and its nvidia-* libraries, fetched from PyPI), then reused."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PYTHON312 = [os.environ.get("DIFFLLM_PYTHON312", ""), "python3.12"]  # then pyenv's 3.12 builds
# The image's Python packages, as docs/gpu.md's source (the device tool's KINDS.md) read them on 2026-11-17.
IMAGE_PACKAGES = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
# What the simulated image installs: the image's versions where KINDS.md gives them, of the packages the trainer and
# DeepSpeed import (torch brings triton 3.6.0, jinja2, sympy, networkx, filelock, fsspec, typing-extensions).
INSTALL = [
    "torch==2.11.0",
    "numpy==2.5.2",
    "pyyaml",
    "safetensors==0.8.0",
    "tokenizers==0.23.2",
    "psutil",
    "py-cpuinfo",
    "msgpack",
    "ninja",
    "einops",
    "tqdm",
    "packaging",
]
ALWAYS_BLOCKED = {"flash_attn"}  # an optional extra of diffllm that the image lacks; not in the dev venv either
ALLOW_ENV = "DIFFLLM_IMAGE_SIM_ALLOW"

SITECUSTOMIZE = '''"""The lent GPU image simulated (tests/scripts/image_sim.py): a module of a package the image lacks
is refused (ModuleNotFoundError on import, None from importlib.util.find_spec) unless a directory of ${allow} holds
it."""
import glob
import os
import sys

BLOCKED = ${blocked}  # top-level module names


def _allowed(name):
    dirs = [d for d in os.environ.get("${allow}", "").split(os.pathsep) if d]
    return any(
        os.path.isdir(os.path.join(d, name)) or glob.glob(os.path.join(d, name + ".*py")) or
        glob.glob(os.path.join(d, name + ".*.so"))
        for d in dirs
    )


for _name in BLOCKED:
    if _name not in sys.modules and not _allowed(_name):
        sys.modules[_name] = None  # import: ModuleNotFoundError; find_spec: None
'''


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def blocked_modules() -> list[str]:
    """Top-level modules of the packages this (dev) venv holds that are not on the image, and ALWAYS_BLOCKED."""
    image = {_norm(p) for p in IMAGE_PACKAGES}
    out = set(ALWAYS_BLOCKED)
    for module, dists in importlib.metadata.packages_distributions().items():
        if module.isidentifier() and not any(_norm(d) in image for d in dists) and module not in ("diffllm", "tests"):
            out.add(module)
    return sorted(out)


def _python312() -> str:
    """A Python 3.12 that runs (a pyenv shim on PATH may name a version it cannot run)."""
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    for cand in [*PYTHON312, *map(str, pyenv)]:
        path = shutil.which(cand) if cand else None
        probe = [path, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"] if path else None
        if probe and subprocess.run(probe, capture_output=True).returncode == 0:
            return path
    pytest.skip("no python3.12 on this machine (set DIFFLLM_PYTHON312): the image's Python cannot be simulated")


def venv() -> Path:
    """The simulated image's python: its venv is built once (keyed by what it installs), its import blocker written
    anew each time (the packages to refuse follow this venv's)."""
    key = hashlib.sha256(json.dumps([INSTALL, SITECUSTOMIZE]).encode()).hexdigest()[:12]
    root = Path(os.environ.get("DIFFLLM_IMAGE_SIM") or Path.home() / ".cache/diffllm/image-sim")
    done = root / key
    root.mkdir(parents=True, exist_ok=True)
    python = str(done / "bin/python")
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions building the same venv: one builds, the other waits
        if not (done / ".complete").exists():  # a build cut short is started again
            shutil.rmtree(done, ignore_errors=True)
            subprocess.run([_python312(), "-m", "venv", str(done)], check=True, timeout=300)
            subprocess.run([python, "-m", "pip", "install", "-q", "--no-cache-dir", *INSTALL], check=True, timeout=1800)
            (done / ".complete").write_text("\n".join(INSTALL) + "\n")
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        source = SITECUSTOMIZE.replace("${allow}", ALLOW_ENV).replace("${blocked}", repr(blocked_modules()))
        Path(site, "sitecustomize.py").write_text(source)
    return Path(python)
