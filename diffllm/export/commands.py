"""`diffllm export run=<dir> out=<dir> [step=...] [format=auto|stablelm|llama|diffllama|remote] [dtype=...]` and
`diffllm import <hf-dir> out=<run dir>`: Hydra apps on configs/export.yaml and configs/import.yaml, their keys typed by
ExportConfig and ImportConfig (named in their registry entries, diffllm/cli/registry.py)."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig

from ..config import hydra_app
from ..errors import UserError


def _required(c: Any, keys: tuple[str, ...], command: str, example: str) -> None:
    """Keys a command cannot run without (its defaults are null: the composed config itself is valid)."""
    for key in keys:
        if not getattr(c, key):
            raise UserError(f"{key}= is required (e.g. diffllm {command} {example})")


@dataclass
class ExportConfig:
    run: Optional[str] = None  # a run directory (or its checkpoints/step<N> folder)
    out: Optional[str] = None  # the Hugging Face directory to write
    step: Any = "latest"  # latest | a step number
    format: str = "auto"  # auto | stablelm | llama | diffllama | remote
    dtype: str = "float32"  # of the written weights: float32 | bfloat16 | float16
    force: bool = False  # replace a non-empty out (and everything in it); false: refuse it


@dataclass
class ImportConfig:
    src: Optional[str] = None  # the Hugging Face model directory (may be given first, without src=)
    out: Optional[str] = None  # the run directory to create


@hydra_app("export", {"": ExportConfig})
def _export(cfg: DictConfig, typed: dict) -> None:
    from .hf import export_run

    c = typed[""]
    _required(c, ("run", "out"), "export", "run=runs/diff-tiny out=hf/diff-tiny")
    with contextlib.redirect_stdout(sys.stderr):  # what libraries print (DeepSpeed's "Setting accelerator to CPU")
        done = export_run(c.run, c.out, step=c.step, format=c.format, dtype=c.dtype, force=c.force)
    print(f"format               {done.format} ({done.hf_class}): {done.reason}")
    print(f"wrote                {done.out}")
    remote = ", trust_remote_code=True" if done.format == "remote" else ""
    print(f"load with            AutoModelForCausalLM.from_pretrained({str(done.out)!r}{remote})")


@hydra_app("import", {"": ImportConfig})
def _import(cfg: DictConfig, typed: dict) -> None:
    from .hf_import import import_hf

    c = typed[""]
    _required(c, ("src", "out"), "import", "hf/stablelm-3b-4e1t out=runs/stablelm-cont")
    mc, run_dir = import_hf(c.src, c.out)
    print(f"imported             {c.src} as {mc.arch} ({mc.norm}, {mc.n_layers} layers, d_model {mc.d_model})")
    print(f"wrote                {run_dir}/checkpoints/step0")
    print(f"continue with        diffllm train model.init_from={run_dir} ...")


def export_main() -> None:
    _export()


def import_main() -> None:
    """The HF directory may come first without a key: `diffllm import <hf-dir> out=...` = `src=<hf-dir>`."""
    sys.argv = [sys.argv[0]] + [a if "=" in a or a.startswith("-") else f"src={a}" for a in sys.argv[1:]]
    _import()
