"""`diffllm export run=<dir> out=<dir> [step=...] [format=auto|stablelm|llama|diffllama|remote] [dtype=...]` and
`diffllm import <hf-dir> out=<run dir>`: Hydra apps on configs/export.yaml and configs/import.yaml."""
from __future__ import annotations

import sys

from omegaconf import DictConfig

from ..config import hydra_app
from ..errors import UserError


def _required(cfg: DictConfig, key: str, command: str, example: str) -> str:
    """hydra_app turns the ValueError into one line on stderr, exit code 2."""
    value = cfg.get(key)
    if value in (None, "", "???"):
        raise UserError(f"{key}= is required (e.g. diffllm {command} {example})")
    return str(value)


@hydra_app("export")
def _export(cfg: DictConfig) -> None:
    from .hf import export_run

    example = "run=runs/diff-tiny out=hf/diff-tiny"
    run, out = _required(cfg, "run", "export", example), _required(cfg, "out", "export", example)
    done = export_run(run, out, step=cfg.step, format=str(cfg.format), dtype=str(cfg.dtype))
    print(f"format               {done.format} ({done.hf_class}): {done.reason}")
    print(f"wrote                {done.out}")
    remote = ", trust_remote_code=True" if done.format == "remote" else ""
    print(f"load with            AutoModelForCausalLM.from_pretrained({str(done.out)!r}{remote})")


@hydra_app("import")
def _import(cfg: DictConfig) -> None:
    from .hf_import import import_hf

    example = "hf/stablelm-3b-4e1t out=runs/stablelm-cont"
    src, out = _required(cfg, "src", "import", example), _required(cfg, "out", "import", example)
    mc, run_dir = import_hf(src, out)
    print(f"imported             {src} as {mc.arch} ({mc.norm}, {mc.n_layers} layers, d_model {mc.d_model})")
    print(f"wrote                {run_dir}/checkpoints/step0")
    print(f"continue with        diffllm train model.init_from={run_dir} ...")


def export_main() -> None:
    _export()


def import_main() -> None:
    """The HF directory may come first without a key: `diffllm import <hf-dir> out=...` = `src=<hf-dir>`."""
    sys.argv = [sys.argv[0]] + [a if "=" in a or a.startswith("-") else f"src={a}" for a in sys.argv[1:]]
    _import()
