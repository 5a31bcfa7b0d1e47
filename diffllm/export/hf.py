"""`diffllm export`: a trained run -> a Hugging Face directory that transformers loads offline.

    out/
      config.json, model.safetensors, generation_config.json    the model (a native class, or DiffLLMForCausalLM)
      tokenizer.json, tokenizer_config.json                      the run's tokenizer as a PreTrainedTokenizerFast
      configuration_diffllm.py, modeling_diffllm.py,             format=remote only (trust_remote_code):
      diffllm_{layers,documents,attention}_<h>.py                the model's code, its variant's own equations
      README.md                                                  model card: layout, preset, tokens, final val loss

format=auto takes the native class that represents the model exactly (StableLM, Llama, DiffLlama) and falls back to
remote code for the rest (LayerNorm or partial-rotary Diff, Diff V2), saying which and why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional, Union

import torch

from ..errors import UserError
from ..model import ModelConfig
from ..model.parametrization import folded
from ..runs import Run, read_metrics
from . import deepseek, diffllama, llama, remote, stablelm

FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (stablelm, llama, diffllama, deepseek, remote)}
NATIVE = (stablelm, llama, diffllama, deepseek)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Exported:
    out: Path
    format: str
    hf_class: str
    reason: str  # why this format (for format=auto: why no native class when remote)


def check_format_name(fmt: str) -> None:
    """A format name that is none of ours: a one-line ValueError with the nearest name (before any run is read)."""
    if fmt != "auto" and fmt not in FORMATS:
        import difflib

        near = difflib.get_close_matches(fmt, list(FORMATS) + ["auto"], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UserError(f"format={fmt!r}: expected one of auto, {', '.join(FORMATS)}{hint}")


def check_out(out: Path, force: bool) -> None:
    """`out` must be a new or empty folder, unless `force` (then the export replaces it whole): a model written over
    another would mix their files. A one-line UserError, before any run is read."""
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out}: is a file, not a folder")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if entries and not force:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(
            f"out={out}: not empty ({shown}); choose a new folder, or pass force=true to replace it and all it holds"
        )


@contextlib.contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """A temporary sibling folder to write into; when the body succeeds it takes `out`'s place (an old `out` is
    removed only then), when it fails it is removed: `out` holds a whole export or what it held before."""
    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}.old{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def choose_format(cfg: ModelConfig, fmt: str = "auto") -> tuple[ModuleType, str]:
    """(format module, why): auto -> the exact native class for cfg, else remote; an explicit format that cannot
    represent cfg is a one-line ValueError suggesting remote."""
    if fmt == "auto":
        reasons = []
        for m in NATIVE:
            why = m.why_not(cfg)
            if why is None:
                return m, f"{m.HF_CLASS} represents {cfg.arch}/{cfg.norm} exactly"
            reasons.append(why)
        relevant = [r for r in reasons if f"has arch={cfg.arch}" not in r] or reasons
        return remote, f"no native class fits ({'; '.join(relevant)}): trust_remote_code export"
    check_format_name(fmt)
    why = FORMATS[fmt].why_not(cfg)
    if why is not None:
        raise UserError(f"format={fmt} cannot represent this model exactly: {why}; use format=remote (or auto)")
    return FORMATS[fmt], f"format={fmt} requested"


def hf_tokenizer(tok):
    """Our Tokenizer as a PreTrainedTokenizerFast: no BOS is added (training appended EOS after each document, so
    EOS also serves as BOS and pad), and a literal special-token string in text is text, as in training."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok.tk,
        bos_token=tok.eos_token,
        eos_token=tok.eos_token,
        pad_token=tok.eos_token,
        split_special_tokens=True,
        add_bos_token=False,
        clean_up_tokenization_spaces=False,
    )


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' tqdm bar while save_pretrained writes ("Writing model shards") off: an export says what it wrote
    in its own lines. Its and huggingface_hub's bar settings are as they were after."""
    import warnings

    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    was_on, hub_off = hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS=1 keeps the hub's off, with a warning
                warnings.simplefilter("ignore")
                hf_logging.enable_progress_bar()
        if hub_off:
            hub.disable_progress_bars()


def write_hf(
    cfg: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    out: Union[str, Path],
    fmt: ModuleType,
    tokenizer=None,
    card: str = "",
    dtype: str = "float32",
) -> Path:
    """Write the HF directory for (cfg, our state dict) in format module `fmt`, weights in `dtype`."""
    import transformers
    from transformers import GenerationConfig

    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    cfg, state_dict = folded(cfg, state_dict)  # mup: its multipliers into the weights, an sp model
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fmt is remote:  # the bundle's own classes: the model the user will load
        bundle = remote.write_bundle(cfg, out)
        cls, hf_cfg = bundle.DiffLLMForCausalLM, remote.hf_config(cfg, bundle.DiffLLMConfig)
    else:
        cls, hf_cfg = getattr(transformers, fmt.HF_CLASS), fmt.hf_config(cfg)
    if tokenizer is not None:
        hf_cfg.bos_token_id = hf_cfg.eos_token_id = hf_cfg.pad_token_id = tokenizer.eos_id
    hf_cfg.architectures = [fmt.HF_CLASS]
    with torch.device("meta"):
        model = cls(hf_cfg)
    sd = {k: v.detach().float().to(DTYPES[dtype]).contiguous() for k, v in fmt.to_hf(cfg, state_dict).items()}
    hf_cfg.dtype = dtype
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    if missing or unexpected:  # a mapping bug, not bad input
        raise RuntimeError(f"{fmt.HF_CLASS}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tie_embeddings:
        model.tie_weights()
    with _no_progress_bar():
        model.save_pretrained(out)
    gen = (
        dict(bos_token_id=tokenizer.eos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id)
        if tokenizer is not None
        else {}
    )
    GenerationConfig(**gen).save_pretrained(out)
    if tokenizer is not None:
        hf_tokenizer(tokenizer).save_pretrained(out)
    if card:
        (out / "README.md").write_text(card)
    return out


def final_val_loss(run: Run) -> Optional[float]:
    summary = run.summary() or {}
    if summary.get("final_val_loss") is not None:
        return float(summary["final_val_loss"])
    vals = [r["val_loss"] for r in read_metrics(run.dir) if r.get("val_loss") is not None]
    return float(vals[-1]) if vals else None


def model_card(run: Run, cfg: ModelConfig, meta: dict, fmt: ModuleType, reason: str, n_params: int) -> str:
    import yaml

    loss = final_val_loss(run)
    config = run.config()
    load = "AutoModelForCausalLM.from_pretrained(path" + (", trust_remote_code=True)" if fmt is remote else ")")
    lines = [
        "---",
        "library_name: transformers",
        "tags: [diffllm" + (", custom_code]" if fmt is remote else "]"),
        "---",
        f"# {cfg.name}",
        "",
        f"A {cfg.variant.label} (`arch: {cfg.arch}`) trained with diffllm, exported as `{fmt.HF_CLASS}` ({reason}).",
        "",
        "| | |",
        "|---|---|",
        f"| architecture | {cfg.arch}, {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads "
        f"({cfg.kv_heads} kv), {cfg.norm}, rotary {cfg.rotary_pct:g}{' interleaved' if cfg.rope_interleaved else ''} |",
        f"| preset | {cfg.name} |",
        f"| parameters | {n_params:,} (vocabulary {cfg.padded_vocab_size}) |",
        f"| tokens trained | {int(meta.get('tokens', 0)):,} (step {meta.get('step')}) |",
        f"| final validation loss | {'-' if loss is None else f'{loss:.4f}'} |",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = {load}",
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        "```",
        "",
        "## The run's config",
        "",
        "```yaml",
        yaml.safe_dump(config if config is not None else {"model": asdict(cfg)}, sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def export_run(
    run_path: Union[str, Path],
    out: Union[str, Path],
    step: Union[int, str] = "latest",
    format: str = "auto",
    dtype: str = "float32",
    force: bool = False,
) -> Exported:
    """Export one checkpoint of a run (its latest by default) to `out`, a new or empty folder (`force`: replace a
    non-empty one). The conversions run in fp32/fp64, then the weights are cast to `dtype`; the files are written
    into a temporary sibling that is renamed to `out` when complete."""
    check_format_name(format)  # the arguments first: they need no run
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    out = Path(out)
    check_out(out, force)
    run = Run(run_path)
    ckpt = run.checkpoint(step)  # a one-line error for a run without checkpoints or a missing step
    cfg, model, tok = run.model(ckpt.step if run.pinned is None else "latest")
    fmt, reason = choose_format(cfg, format)
    card = model_card(run, cfg, ckpt.meta, fmt, reason, sum(p.numel() for p in model.parameters()))
    with replacing(out) as tmp:
        write_hf(cfg, model.state_dict(), tmp, fmt, tok, card, dtype)
    return Exported(out, fmt.NAME, fmt.HF_CLASS, reason)
