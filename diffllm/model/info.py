"""`diffllm info model=<preset>`: parameters, training FLOPs per token and bf16 weight memory of a preset;
`all=true`: the table of every preset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig

from ..config import hydra_app
from .accounting import model_stats
from .config import ModelConfig
from .presets import load_preset, preset_names


def _fmt(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def table(cfgs: list[ModelConfig], seq_len: int | None) -> str:
    head = (
        "| preset | arch | d_model | layers | heads (kv) | d | ffn | vocab | params | non-emb params "
        "| train GFLOPs/token | bf16 weights | KV bytes/token |"
    )
    rows = [head, "|" + "---|" * 13]
    for c in cfgs:
        s = model_stats(c, seq_len)
        rows.append(
            f"| {c.name} | {c.arch} | {c.d_model} | {c.n_layers} | {c.variant.heads(c).label()} | {c.head_dim} | "
            f"{c.ffn_hidden} | {c.padded_vocab_size} | {s.total_params:,} | {s.nonembedding_params:,} | "
            f"{s.flops_per_token / 1e9:.3g} @{s.seq_len} | {s.bf16_weight_bytes / 2**30:.2f} GiB | "
            f"{s.kv_bytes_per_token:,} |"
        )
    return "\n".join(rows)


@dataclass
class InfoConfig:
    """`diffllm info`'s own keys (the model group is a ModelConfig)."""

    all: bool = False  # print the table of every preset
    seq_len: Optional[int] = None  # null -> the preset's max_seq_len


SCHEMA = {"model": ModelConfig, "": InfoConfig}  # the typed configs of configs/info.yaml


@hydra_app("info", SCHEMA)
def main(cfg: DictConfig, typed: dict) -> None:
    own, mc = typed[""], typed["model"]
    seq_len = own.seq_len
    if own.all:  # `diffllm info all=true`
        cfgs = [load_preset(n) for n in preset_names()]
        cfgs.sort(key=lambda c: (model_stats(c).nonembedding_params, c.arch))  # by size, the variants side by side
        print(table(cfgs, seq_len))
        return
    s = model_stats(mc, seq_len)
    h = mc.variant.heads(mc)
    print(f"preset               {mc.name} ({mc.arch}: {mc.variant.label})")
    print(f"heads (kv)           {h.label()}, d={mc.head_dim}, values {h.value_dim} wide")
    print(f"parameters           {s.total_params:,} ({_fmt(s.total_params)})")
    print(f"  input embedding    {s.embedding_params:,}")
    print(f"  non-embedding      {s.nonembedding_params:,} ({_fmt(s.nonembedding_params)})")
    print(
        f"train FLOPs/token    {s.flops_per_token:.4g} at seq_len {s.seq_len} with attn_backend={mc.attn_backend} "
        f"(6 x {s.matmul_params:,} matmul params + attention)"
    )
    print(f"bf16 weights         {s.bf16_weight_bytes / 2**30:.2f} GiB")
    print(
        f"KV bytes/token       {s.kv_bytes_per_token:,} (all {mc.n_layers} layers, bf16: "
        f"{mc.variant.kv_cache_width(mc):,} numbers per layer; "
        f"{s.kv_bytes_per_token * 1024 / 2**20:.3g} MiB per 1K tokens)"
    )
