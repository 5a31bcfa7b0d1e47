"""`diffllm import`: a Hugging Face model directory (Llama, StableLM, DiffLlama, or a diffllm remote-code export) ->
our (ModelConfig, state dict), and a diffllm run directory at step 0 that `diffllm train` can start from.

    cfg, state_dict = load_pretrained("hf/stablelm-3b-4e1t")   # or a diffllm run directory (its latest checkpoint)
    import_hf("hf/stablelm-3b-4e1t", "runs/stablelm-cont")      # checkpoints/step0 (ZeRO-0 layout), tokenizer.json
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Union

import torch

from ..errors import UserError
from ..model import DecoderLM, ModelConfig
from ..runs import Run, choose_tokenizer, consolidated_state_dict, read_json, read_tokenizer
from .hf import FORMATS, remote

BY_MODEL_TYPE = {m.MODEL_TYPE: m for m in FORMATS.values()}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if files:
        return {k: v for f in files for k, v in load_file(str(f)).items()}
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        return {k: v for f in bins for k, v in torch.load(f, map_location="cpu", weights_only=True).items()}
    raise UserError(f"{path}: no *.safetensors or pytorch_model*.bin weights")


def read_hf(path: Union[str, Path]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, our state dict) of an HF model directory; one-line ValueError for what we cannot represent."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a Hugging Face model directory (no config.json)")
    model_type = read_json(path / "config.json").get("model_type")
    fmt = BY_MODEL_TYPE.get(model_type)
    if fmt is None:
        raise UserError(
            f"{path}: model_type={model_type!r} cannot be imported (supported: {', '.join(sorted(BY_MODEL_TYPE))})"
        )
    if fmt is remote:
        from .remote.configuration_diffllm import DiffLLMConfig

        hf_cfg = DiffLLMConfig.from_pretrained(str(path))
    else:
        from transformers import AutoConfig

        hf_cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    sd = _weights(path)
    embed = "tok_embeddings.weight" if fmt is remote else "model.embed_tokens.weight"
    if "lm_head.weight" not in sd and getattr(hf_cfg, "tie_word_embeddings", False):
        sd["lm_head.weight"] = sd[embed]
    cfg, ours = fmt.from_hf(hf_cfg, sd)
    with torch.device("meta"):
        expected = DecoderLM(cfg).state_dict()
    missing, unexpected = sorted(set(expected) - set(ours)), sorted(set(ours) - set(expected))
    bad_shape = [k for k in expected if k in ours and ours[k].shape != expected[k].shape]
    if missing or unexpected or bad_shape:
        raise UserError(
            f"{path}: weights do not fit the {model_type} config (missing {missing[:2]}, unexpected "
            f"{unexpected[:2]}, wrong shape {bad_shape[:2]})"
        )
    return cfg, ours


def is_run(path: Path) -> bool:
    return (path / "meta.json").is_file() or (path / "checkpoints").is_dir() or path.name == "checkpoints"


def load_pretrained(path: Union[str, Path]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """`model.init_from`: (ModelConfig, fp32 state dict in our names) from an HF directory or a diffllm run (its
    latest checkpoint, or the step<N> folder given)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"model.init_from={path}: no such directory")
    if is_run(path):
        ckpt = Run(path).checkpoint("latest")
        return ModelConfig(**ckpt.meta["model"]), consolidated_state_dict(ckpt)
    cfg, sd = read_hf(path)
    return cfg, {k: v.float() for k, v in sd.items()}


def import_hf(src: Union[str, Path], out: Union[str, Path]) -> tuple[ModelConfig, Path]:
    """Write run directory `out` holding `src`'s weights as checkpoint step 0 (DeepSpeed's ZeRO-0 layout) and, when
    `src` has one, its tokenizer (diffllm.runs writes every file; choose_tokenizer decides the tokenizer)."""
    src, out = Path(src), Path(out)
    run = Run(out.resolve())
    if run.files():
        what = "checkpoints" if run.checkpoints_dir.exists() else ", ".join(p.name for p in run.files())
        raise UserError(f"out={out}: already holds {what}; choose a new run directory")
    cfg, sd = read_hf(src)
    tok_path, _ = choose_tokenizer(run, init_from=src)
    tok = read_tokenizer(tok_path, "<|endoftext|>") if tok_path else None  # the folder's own eos_token wins
    run.write_weights(
        sd,
        {
            "step": 0,
            "tokens": 0,
            "world_size": 1,
            "zero_stage": 0,
            "model": asdict(cfg),
            "imported_from": str(src.resolve()),
        },
    )
    config: dict = {"model": asdict(cfg), "imported_from": str(src.resolve())}
    if tok is not None:
        run.write_tokenizer(tok.tk.to_str())
        config["data"] = {"tokenizer": {"eos_token": tok.eos_token}}  # its path: the run's own tokenizer.json
    run.write_config(config, own_tokenizer=tok is not None)
    return cfg, out
