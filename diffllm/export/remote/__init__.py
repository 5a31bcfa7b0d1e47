"""format=remote: any diffllm model (every registered arch, norm and rotary) as trust_remote_code files shipped with
the export.

The bundle, written next to the weights (torch and transformers only: a user needs no diffllm):
    configuration_diffllm.py   DiffLLMConfig (this folder's file, verbatim)
    modeling_diffllm.py        DiffLLMForCausalLM, generic over the attention class (this folder's file, verbatim)
    diffllm_layers_<h>.py      diffllm/model/layers.py, verbatim: norms, rotary, SwiGLU, AttentionEquations
    diffllm_documents_<h>.py   diffllm/model/documents.py, verbatim: the masks
    diffllm_attention_<h>.py   the variant's own equations classes (`AttentionVariant.equations()`: the classes its
                               diffllm forward runs), their source below `import math, torch`, `from torch import nn`,
                               `import torch.nn.functional as F` and `from .diffllm_layers import *`; the last one bound
                               to the name ATTENTION
<h> is a digest of those three files, also written at the end of configuration_diffllm.py: transformers maps a config
class it has loaded to the first model class it built for it, and older versions take the modules a modeling file
imports from sys.modules by name, so two exports of other variants loaded in one process would otherwise share the
first one's attention. config.json's `auto_map` points transformers at the files. The weights keep
diffllm's own parameter names, so the export and the import are the identity on the state dict.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Optional

import torch

from ...errors import UserError
from ...model import ModelConfig, documents, layers

NAME, HF_CLASS, MODEL_TYPE = "remote", "DiffLLMForCausalLM", "diffllm"
HERE = Path(__file__).parent
AUTO_MAP = {
    "AutoConfig": "configuration_diffllm.DiffLLMConfig",
    "AutoModelForCausalLM": "modeling_diffllm.DiffLLMForCausalLM",
}
HEADER = '''"""The attention of this model's variant, {arch!r} ({label}): {names} from {module}, copied by
diffllm export."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .diffllm_layers import *  # noqa: F401,F403 - the names a remote attention class may use

'''


def why_not(cfg: ModelConfig) -> Optional[str]:
    if not cfg.variant.equations():
        return f"arch={cfg.arch} has no equations class (an AttentionEquations subclass among its bases)"
    return None  # the variant's own equations, for every layout


def bundle(cfg: ModelConfig) -> dict[str, str]:
    """File name -> source of the remote-code bundle for cfg's variant."""
    v, classes = cfg.variant, cfg.variant.equations()
    if not classes:
        raise UserError(f"format=remote: {why_not(cfg)}")
    attention = HEADER.format(
        arch=v.arch,
        label=v.label,
        names=", ".join(c.__qualname__ for c in classes),
        module=", ".join(dict.fromkeys(c.__module__ for c in classes)),
    )
    attention += "\n\n".join(inspect.getsource(c) for c in classes) + f"\n\nATTENTION = {classes[-1].__name__}\n"
    shipped = {
        "diffllm_layers": Path(layers.__file__).read_text(),
        "diffllm_documents": Path(documents.__file__).read_text(),
    }
    h = hashlib.sha1(("".join(shipped.values()) + attention).encode()).hexdigest()[:10]
    named = {name: f"{name}_{h}" for name in (*shipped, "diffllm_attention")}

    def renamed(text: str) -> str:
        for old, new in named.items():
            text = text.replace(f"from .{old} import", f"from .{new} import")
        return text

    config = (HERE / "configuration_diffllm.py").read_text() + (
        f"\n# Bundle {h}. Each bundle's config class is its own: once transformers has loaded a remote model, it maps\n"
        "# that config class to that model class, and would build any later export of another variant with it.\n"
    )
    return {
        "configuration_diffllm.py": config,
        "modeling_diffllm.py": renamed((HERE / "modeling_diffllm.py").read_text()),
        **{f"{named[name]}.py": text for name, text in shipped.items()},
        f"{named['diffllm_attention']}.py": renamed(attention),
    }


def write_bundle(cfg: ModelConfig, out: Path) -> types.ModuleType:
    """Write the bundle into `out` and import it (as a package of its own, named after its content): its
    modeling_diffllm module, whose DiffLLMForCausalLM and DiffLLMConfig the export builds the model with."""
    files = bundle(cfg)
    for name, text in files.items():
        (out / name).write_text(text)
    digest = hashlib.sha1("".join(files[k] for k in sorted(files)).encode()).hexdigest()[:16]
    pkg = f"_diffllm_remote_{digest}"
    if pkg not in sys.modules:  # a package whose folder is `out`: the bundle's relative imports resolve there
        module = types.ModuleType(pkg)
        module.__path__ = [str(Path(out).resolve())]
        sys.modules[pkg] = module
    return importlib.import_module(f"{pkg}.modeling_diffllm")


def hf_config(cfg: ModelConfig, config_class=None):
    """The DiffLLMConfig of cfg (`config_class`: the bundle's class; default this folder's, for reading back)."""
    if config_class is None:
        from .configuration_diffllm import DiffLLMConfig as config_class
    return config_class(
        arch=cfg.arch,
        preset=cfg.name,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.kv_heads,
        ffn_dim=cfg.ffn_hidden,
        vocab_size=cfg.padded_vocab_size,
        norm=cfg.norm,
        norm_eps=cfg.norm_eps,
        rotary_pct=cfg.rotary_pct,
        rotary_dim=cfg.rotary_dim,  # the width the variant rotates (MLA: qk_rope_head_dim, not rotary_pct of d)
        rope_theta=cfg.rope_theta,
        rope_interleaved=cfg.rope_interleaved,
        qkv_bias=cfg.qkv_bias,
        tie_embeddings=cfg.tie_embeddings,
        init_std=cfg.init_std,
        max_seq_len=cfg.max_seq_len,
        auto_map=dict(AUTO_MAP),
        **cfg.variant.remote_config(cfg),
    )


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(sd)


def from_hf(hf_cfg, sd: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    skip = ("name", "vocab_multiple")  # the preset name, the padded vocabulary; variant keys (remote_config) too
    kw = {k: getattr(hf_cfg, k) for k in names if k not in skip and hasattr(hf_cfg, k)}
    return ModelConfig(name=hf_cfg.preset, vocab_multiple=1, **kw), dict(sd)
