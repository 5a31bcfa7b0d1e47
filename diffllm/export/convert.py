"""What every Hugging Face mapping shares: our <-> HF parameter names (the Llama family's layout) and the row
permutations that move a head's dims or a layer's heads into HF's order.

Llama, StableLM and DiffLlama name their weights alike (`model.layers.{i}.self_attn.q_proj.weight`, ...), so one
table serves all three; the format modules (llama.py, stablelm.py, diffllama.py) add only what differs.
"""

from __future__ import annotations

import re
from typing import Callable

import torch

from ..errors import UserError
from ..model import ModelConfig

# (ours, HF) name prefixes inside layer {i}, the first that matches wins: the attention's parameters keep their names
# (a variant's own, e.g. Diff's lambda_q1, as HF's DiffLlama names them) but for the output projection.
LAYER_NAMES = [
    ("attn_norm", "input_layernorm"),
    ("attn.out_proj", "self_attn.o_proj"),
    ("attn", "self_attn"),
    ("mlp_norm", "post_attention_layernorm"),
    ("mlp.gate_proj", "mlp.gate_proj"),
    ("mlp.up_proj", "mlp.up_proj"),
    ("mlp.down_proj", "mlp.down_proj"),
]
TOP_NAMES = [("tok_embeddings", "model.embed_tokens"), ("norm", "model.norm"), ("lm_head", "lm_head")]


def _rename(name: str, pairs: list[tuple[str, str]], top: list[tuple[str, str]], layer_from: str, layer_to: str) -> str:
    m = re.fullmatch(layer_from + r"\.(\d+)\.(.+)", name)
    if m:
        i, rest = m.groups()
        for src, dst in pairs:
            if rest == src or rest.startswith(src + "."):
                return f"{layer_to}.{i}.{dst}{rest[len(src) :]}"
        raise KeyError(f"no Hugging Face name for layer parameter {name!r}")
    for src, dst in top:
        if name.startswith(src + "."):
            return dst + name[len(src) :]
    raise KeyError(f"no Hugging Face name for parameter {name!r}")


def to_hf_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> HF names (tensors are shared, not copied)."""
    return {_rename(k, LAYER_NAMES, TOP_NAMES, "layers", "model.layers"): v for k, v in state_dict.items()}


def from_hf_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF state dict -> our names (rotary caches and other buffers are dropped)."""
    swap = lambda pairs: [(b, a) for a, b in pairs]  # noqa: E731
    return {
        _rename(k, swap(LAYER_NAMES), swap(TOP_NAMES), r"model\.layers", "layers"): v
        for k, v in state_dict.items()
        if not k.endswith("rotary_emb.inv_freq")
    }


# ----- row permutations ----------------------------------------------------------------------------------------------
def half_rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Row order inside one head that turns interleaved rotary (pairs 2i, 2i+1) into rotate-half (pairs i, i + r/2):
    [0, 2, ..., r-2, 1, 3, ..., r-1, r, ..., d-1]. q.k is unchanged because q and k rows move alike."""
    r = torch.arange(rotary_dim)
    return torch.cat([r[0::2], r[1::2], torch.arange(rotary_dim, head_dim)])


def pair_major_order(n: int) -> torch.Tensor:
    """Head order that turns adjacent pairs (2i, 2i+1) into two blocks [0, 2, ..., n-2 | 1, 3, ..., n-1]."""
    return torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])


def inverse(order: torch.Tensor) -> torch.Tensor:
    return torch.argsort(order)


def permute_rows(
    w: torch.Tensor, n_heads: int, head_order: torch.Tensor | None = None, dim_order: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows of a projection (or its bias) viewed as `n_heads` blocks of d: reorder the heads, then the dims inside
    each head. w: (n_heads * d, ...) -> same shape."""
    v = w.reshape(n_heads, -1, *w.shape[1:])  # (H, d, ...)
    if head_order is not None:
        v = v[head_order]
    if dim_order is not None:
        v = v[:, dim_order]
    return v.reshape(w.shape).contiguous()


def map_qk(sd: dict[str, torch.Tensor], cfg: ModelConfig, fn: Callable[[torch.Tensor, int], torch.Tensor]) -> dict:
    """Apply fn(tensor, n_heads) to every q/k projection weight and bias (our names): q has cfg.n_heads heads of d and
    k cfg.kv_heads, in every architecture (a Diff layer's 2h sub-heads are the Transformer's n_heads)."""
    out = dict(sd)
    for name, t in sd.items():
        if re.search(r"\.attn\.q_proj\.(weight|bias)$", name):
            out[name] = fn(t, cfg.n_heads)
        elif re.search(r"\.attn\.k_proj\.(weight|bias)$", name):
            out[name] = fn(t, cfg.kv_heads)
    return out


def rotate_half_layout(sd: dict[str, torch.Tensor], cfg: ModelConfig, to_half: bool = True) -> dict:
    """Our interleaved-rotary q/k rows <-> rotate-half rows (to_half=False undoes it). A no-op for rotate-half runs."""
    if not cfg.rope_interleaved:
        return dict(sd)
    order = half_rotary_order(cfg.head_dim, cfg.rotary_dim)
    order = order if to_half else inverse(order)
    return map_qk(sd, cfg, lambda t, n: permute_rows(t, n, dim_order=order))


def check_config(cfg, want: dict, fmt: str) -> None:
    """An HF config must have these values (what our model cannot represent otherwise): one-line ValueError."""
    for key, value in want.items():
        got = getattr(cfg, key, None)
        if got != value:
            raise UserError(f"{fmt}: config.json {key}={got!r} is not supported (diffllm needs {value!r})")


def rope_theta(hf_cfg) -> float:
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_cfg, "rope_theta", 10000.0)))


def common_config_kwargs(cfg: ModelConfig) -> dict:
    """HF config keywords every Llama-family format shares (the embedding is our padded vocabulary)."""
    return dict(
        vocab_size=cfg.padded_vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        initializer_range=cfg.init_std,
        rope_theta=cfg.rope_theta,
        attention_dropout=0.0,
        tie_word_embeddings=cfg.tie_embeddings,
    )


def common_model_kwargs(hf_cfg, fmt: str) -> dict:
    """ModelConfig keywords read back from a Llama-family HF config (checking what we cannot represent)."""
    check_config(hf_cfg, {"hidden_act": "silu"}, fmt)
    rope = (getattr(hf_cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        raise UserError(
            f"{fmt}: config.json rope_type={rope!r} (RoPE scaling) is not supported (diffllm needs 'default')"
        )
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    if head_dim * hf_cfg.num_attention_heads != hf_cfg.hidden_size:
        raise UserError(
            f"{fmt}: config.json head_dim={head_dim} x {hf_cfg.num_attention_heads} heads != "
            f"hidden_size={hf_cfg.hidden_size} (diffllm needs d_model = heads x head_dim)"
        )
    return dict(
        name=getattr(hf_cfg, "_name_or_path", "") and str(hf_cfg._name_or_path).rstrip("/").split("/")[-1] or fmt,
        d_model=hf_cfg.hidden_size,
        n_layers=hf_cfg.num_hidden_layers,
        n_heads=hf_cfg.num_attention_heads,
        n_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or hf_cfg.num_attention_heads,
        ffn_dim=hf_cfg.intermediate_size,
        vocab_size=hf_cfg.vocab_size,
        vocab_multiple=1,
        rope_theta=rope_theta(hf_cfg),
        rope_interleaved=False,
        tie_embeddings=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
        init_std=getattr(hf_cfg, "initializer_range", 0.02),
        max_seq_len=hf_cfg.max_position_embeddings,
    )


def drop_zero_o_bias(sd: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """HF's attention_bias also gives o_proj a bias, which our models lack: it must be zero (as our export writes)."""
    out = {}
    for name, t in sd.items():
        if name.endswith("self_attn.o_proj.bias"):
            if t.abs().max().item() != 0:
                raise UserError(f"{fmt}: {name} is non-zero; diffllm's output projection has no bias")
            continue
        out[name] = t
    return out


def add_zero_o_bias(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF names; attention_bias=True (our qkv_bias) also gives HF's o_proj a bias: write zeros."""
    if not cfg.qkv_bias:
        return sd
    out = dict(sd)
    for name, t in sd.items():
        if name.endswith("self_attn.o_proj.weight"):
            out[name[: -len("weight")] + "bias"] = torch.zeros(t.shape[0], dtype=t.dtype)
    return out


def unmet(cfg: ModelConfig, hf_name: str, needs: dict[str, tuple[object, str]]) -> str | None:
    """The first requirement `cfg` misses, as "<HF> <has what>, this model has <key>=<value>"; None if all hold.
    needs: ModelConfig key -> (the value the HF class needs, what the HF class has)."""
    for key, (value, has) in needs.items():
        if getattr(cfg, key) != value:
            return f"{hf_name} {has}, this model has {key}={getattr(cfg, key)}"
    return None
