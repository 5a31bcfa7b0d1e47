"""`diffllm scaling coord-check model=<preset> widths=[...]`: the coordinate check of Yang et al. 2022 (Tensor Programs
V, Fig. 5). The preset is trained a few AdamW steps at each width (d_model; head dim, depth and vocabulary fixed; heads
and SwiGLU width scale with it; under model.parametrization=mup the base width is the smallest), on one fixed batch
of Zipf-distributed random tokens, and the mean |activation| of every layer is recorded at every step: the embedding
output, each block's attention output, MLP output and residual stream, and the logits. Under a parametrization whose
hyperparameters transfer (mup) they stay flat across width; under sp the later steps' grow with it.

With `depths=[2,4,8,16]` it varies depth instead (n_layers; the model's own width, heads and vocabulary; under
mup and completep the base width is the model's width, under completep the base depth the smallest): the embedding,
the attention, MLP and residual stream of the block that ends the first half and of the last block, and the logits.
Under completep (residual branches x base_depth / n_layers, CompleteP's α = 1) they stay flat across depth; under mup
the residual stream grows with it.

Writes <out>/coord_check.json (every value, the fitted slopes), <out>/coord_check.png (mean |activation| vs width or
depth, one panel per recorded step) and prints a table of the last step with each layer's slope of log mean|a| on log
width (or depth).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from ..config import hydra_app
from ..errors import UserError
from ..model.config import ModelConfig
from ..model.decoder import DecoderLM
from ..model.parametrization import is_mup
from ..train.optim import param_groups, with_eps
from .config import COORD_CHECK, CoordCheckConfig


def check(own: CoordCheckConfig, model: ModelConfig) -> None:
    """One-line UserErrors for widths the check cannot build."""
    if own.depths:
        d = own.depths
        if len(d) < 2 or any(not isinstance(x, int) or x < 1 for x in d) or list(d) != sorted(set(d)):
            raise UserError(f"depths: want >= 2 increasing positive integers, got {list(d)}")
    w = own.widths
    if len(w) < 2 or any(not isinstance(x, int) or x < 1 for x in w) or list(w) != sorted(set(w)):
        raise UserError(f"widths: want >= 2 increasing positive integers, got {list(w)}")
    if bad := [x for x in w if x % own.head_dim]:
        raise UserError(f"widths: {bad} not a multiple of head_dim={own.head_dim}")
    if own.steps < 1:
        raise UserError(f"steps: must be >= 1, got {own.steps}")
    if own.seq_len > model.max_seq_len:
        raise UserError(f"seq_len: {own.seq_len} exceeds model.max_seq_len={model.max_seq_len}")


def at_width(model: ModelConfig, width: int, own: CoordCheckConfig) -> ModelConfig:
    """The preset at d_model = width: head dim fixed, heads, kv heads and (a set) ffn_dim scaled; mup's base width is
    the smallest width."""
    ratio = width / model.d_model
    heads = width // own.head_dim
    kv = None if model.n_kv_heads is None else max(1, round(model.n_kv_heads * heads / model.n_heads))
    ffn = None if model.ffn_dim is None else round(model.ffn_dim * ratio)
    base = own.widths[0] if is_mup(model) else model.base_width
    return replace(model, d_model=width, n_heads=heads, n_kv_heads=kv, ffn_dim=ffn, base_width=base, init_from=None)


def at_depth(model: ModelConfig, depth: int, own: CoordCheckConfig) -> ModelConfig:
    """The model with `depth` blocks at its own width: its base width is itself (width_mult 1), completep's base depth
    the smallest depth."""
    base = own.depths[0] if model.parametrization == "completep" else model.base_depth
    width = model.d_model if is_mup(model) else model.base_width
    return replace(model, n_layers=depth, base_depth=base, base_width=width, init_from=None)


def ends(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """The layers comparable across depth, at the same fraction of it: the embedding, the block that ends the first
    half (mid.attn, mid.mlp, mid.residual) and the last block (last.*), the logits."""
    depth = 1 + max(int(k[5:].split(".")[0]) for k in values if k.startswith("block"))
    out = {}
    for k, v in values.items():
        block, _, part = k[5:].partition(".")
        if not k.startswith("block"):
            out[k] = v
        elif int(block) == depth // 2 - 1:
            out["mid." + part] = v
        if k.startswith("block") and int(block) == depth - 1:
            out["last." + part] = v
    return {k: out[k] for k in sorted(out, key=lambda k: (k == "logits", k != "embedding", k))}


def batch(vocab: int, own: CoordCheckConfig) -> torch.Tensor:
    """(batch_size, seq_len + 1) tokens, Zipf-distributed (p ~ 1/rank): a unigram the model can learn quickly."""
    g = torch.Generator().manual_seed(own.seed)
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(p / p.sum(), own.batch_size * (own.seq_len + 1), True, generator=g).view(
        own.batch_size, -1
    )


def record(model: DecoderLM, tokens: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
    """One forward: (layer -> mean |activation|, the loss)."""
    seen: dict[str, float] = {}

    def hook(name):
        return lambda mod, inp, out: seen.__setitem__(name, out.detach().abs().mean().item())

    handles = [model.tok_embeddings.register_forward_hook(hook("embedding"))]
    for i, layer in enumerate(model.layers):
        handles += [layer.attn.register_forward_hook(hook(f"block{i}.attn"))]
        handles += [layer.mlp.register_forward_hook(hook(f"block{i}.mlp"))]
        handles += [layer.register_forward_hook(hook(f"block{i}.residual"))]
    try:
        logits = model(tokens[:, :-1])  # (B, T, V)
    finally:
        for h in handles:
            h.remove()
    seen["logits"] = logits.detach().abs().mean().item()
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    return seen, loss


def run_width(cfg: ModelConfig, own: CoordCheckConfig) -> dict[str, list[float]]:
    """layer -> mean |activation| at steps 0..own.steps (step t: after t updates)."""
    torch.manual_seed(own.seed)
    model = DecoderLM(cfg)
    opt = torch.optim.AdamW(with_eps(param_groups(model, own.weight_decay), 1e-8), lr=own.lr, eps=1e-8)
    for g in opt.param_groups:
        g["lr"] = own.lr * g.get("lr_mult", 1.0)  # as train/step.py sets it
    tokens = batch(cfg.vocab_size, own)
    values: dict[str, list[float]] = {}
    for step in range(own.steps + 1):
        seen, loss = record(model, tokens)
        for k, v in seen.items():
            values.setdefault(k, []).append(v)
        if step < own.steps:
            opt.zero_grad()
            loss.backward()
            opt.step()
    return values


def slope(widths: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) on log(width)."""
    x = [math.log(w) for w in widths]
    y = [math.log(max(v, 1e-30)) for v in values]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def coord_check(model: ModelConfig, own: CoordCheckConfig) -> dict:
    """The check's result: {"widths", "steps", "parametrization", "values": {layer: {width: [per step]}},
    "slopes": {layer: slope at the last step}}."""
    check(own, model)
    if own.depths:
        per_depth = {d: ends(run_width(at_depth(model, d, own), own)) for d in own.depths}
        return _summary(model, own, "depths", own.depths, per_depth, width=model.d_model)
    return _summary(model, own, "widths", own.widths, {w: run_width(at_width(model, w, own), own) for w in own.widths})


def _summary(model: ModelConfig, own: CoordCheckConfig, axis: str, points, per_point: dict, **extra) -> dict:
    """The result over `axis` (widths or depths): each layer's values per point and its slope at the last step."""
    layers = list(per_point[points[0]])
    values = {k: {p: per_point[p][k] for p in points} for k in layers}
    slopes = {k: slope(points, [values[k][p][-1] for p in points]) for k in layers}
    return {
        "model": model.name,
        "arch": model.arch,
        "parametrization": model.parametrization,
        axis: list(points),
        **extra,
        "steps": own.steps,
        "lr": own.lr,
        "values": values,
        "slopes": slopes,
    }


def table(result: dict) -> str:
    by_depth = "depths" in result
    widths, tag = (result["depths"], "L") if by_depth else (result["widths"], "d")
    at = f" at d_model {result['width']}" if by_depth else ""
    rows = [
        f"mean |activation| after {result['steps']} steps, {result['arch']} ({result['parametrization']}){at}, "
        f"lr {result['lr']:g}",
        "| layer | " + " | ".join(f"{tag}={w}" for w in widths) + " | slope |",
        "|---|" + "---|" * (len(widths) + 1),
    ]
    for k, by_width in result["values"].items():
        cells = " | ".join(f"{by_width[w][-1]:.4g}" for w in widths)
        rows.append(f"| {k} | {cells} | {result['slopes'][k]:+.3f} |")
    worst = max(result["slopes"], key=lambda k: abs(result["slopes"][k]))
    size = "depth" if by_depth else "width"
    rows.append(
        f"largest |slope|: {worst} {result['slopes'][worst]:+.3f} (flat ~ 0: activations independent of {size})"
    )
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({0, result["steps"] // 2, result["steps"]})
    widths, layers = result.get("depths") or result["widths"], list(result["values"])
    depth = 1 + max([int(k[5:].split(".")[0]) for k in layers if k.startswith("block")], default=0)
    style = {"attn": "-", "mlp": "--", "residual": ":"}
    fig, axes = plt.subplots(1, len(steps), figsize=(4.5 * len(steps) + 2, 4), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], steps):
        for k in layers:
            if k.startswith("block"):  # colour by depth, line style by sublayer
                i, part = k[5:].split(".")
                kw = dict(color=plt.cm.viridis(int(i) / max(1, depth - 1) * 0.85), linestyle=style[part])
            elif "." in k:  # depth: the block that ends the first half (mid) and the last
                end, part = k.split(".")
                kw = dict(color="tab:blue" if end == "mid" else "tab:green", linestyle=style[part])
            else:
                kw = dict(color="black" if k == "logits" else "tab:red", linewidth=2)
            ax.plot(widths, [result["values"][k][w][t] for w in widths], marker="o", markersize=3, label=k, **kw)
        size = "depth (n_layers)" if "depths" in result else "width (d_model)"
        ax.set(xscale="log", yscale="log", xlabel=size, title=f"step {t}")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
    axes[0][0].set_ylabel("mean |activation|")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"coordinate check: {result['arch']}, {result['parametrization']}, lr {result['lr']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@hydra_app("coord_check", COORD_CHECK, prog="diffllm scaling coord-check")
def main(cfg: DictConfig, typed: dict) -> None:
    own = typed[""]
    result = coord_check(typed["model"], own)
    out = Path(own.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coord_check.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out / "coord_check.png")
    print(table(result))
    print(f"wrote {out / 'coord_check.json'} and {out / 'coord_check.png'}")
