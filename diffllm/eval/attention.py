"""`diffllm eval attention`: where the answer position looks in retrieval prompts (the paper's Table 3).

For needle prompts (one needle per prompt by default) with the answer needle at each depth, the attention row of the
position that predicts the first answer token, per layer, averaged over heads and prompts:
  answer  the mass on the answer needle's tokens
  noise   the mass on the rest of the context (the haystack and the other needles; the query tokens are neither)
Transformer rows are softmax rows (they sum to 1). Diff rows are the differential map (A1 - lambda A2) / (1 - lambda):
they also sum to 1, and entries may be negative. Each variant says how its map is rebuilt (see maps.py) and what it
reports per layer beside it (Diff: lambda).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import torch

from .common import EvalError, cli, load_run, out_dir, say, write_json
from .maps import attention_map, capture
from .needle import Format, build_prompt, haystack_tokens


@torch.inference_mode()
def allocation(model: torch.nn.Module, prompts: list) -> dict:
    """{"answer": [per layer], "noise": [per layer]}: mean attention mass from each prompt's answer position."""
    n_layers = len(model.layers)
    answer, noise = np.zeros(n_layers), np.zeros(n_layers)
    for p in prompts:
        pos = p.answers[0][0] - 1  # the position whose next token is the first answer token
        with capture(model) as got:
            model(torch.tensor([p.ids[: pos + 1]]))
        for i, (layer, (x, cos, sin)) in enumerate(zip(model.layers, got["inputs"])):
            row = attention_map(layer.attn, x, cos, sin)[0, :, pos].mean(0)  # (T,): mean over heads
            s, e = p.needle
            a = float(row[s:e].sum())
            answer[i] += a
            noise[i] += float(row[: p.question].sum()) - a
    return {"answer": (answer / len(prompts)).tolist(), "noise": (noise / len(prompts)).tolist()}


@dataclass
class AttentionConfig:
    """Attention to the answer needle vs the rest of the context, per layer and answer depth."""

    run: str = ""
    step: Any = "latest"
    mode: str = "synthetic"  # synthetic | text (see eval needle)
    data: Any = None
    n_needles: int = 1
    depths: List[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])
    length: Optional[int] = None  # null: the model's context
    trials: int = 4
    seed: int = 0
    out: Optional[str] = None


def attention_by_depth(model, tok, mode: str, haystack, n: int, depths: list, length: int, trials: int,
                       seed: int) -> dict:
    """{depth: {"answer": [...], "noise": [...]}} for a model in memory."""
    fmt = Format(mode, tok)
    out = {}
    for depth in depths:
        rng = np.random.default_rng([seed, n, length, int(depth * 100)])
        prompts = [build_prompt(fmt, haystack, n, 1, depth, length, rng) for _ in range(trials)]
        out[str(depth)] = allocation(model, prompts)
    return out


def run_attention(c: AttentionConfig) -> dict:
    from .report import markdown

    run, mcfg, model, tok = load_run(c.run, c.step)
    if c.mode not in ("synthetic", "text"):
        raise EvalError(f"mode={c.mode!r}: expected one of ('synthetic', 'text')")
    length = c.length or mcfg.max_seq_len
    if length > mcfg.max_seq_len:
        raise EvalError(f"length={length}: exceeds the model's context ({mcfg.max_seq_len})")
    hay = haystack_tokens(run.config(), c.data, tok, 4 * length) if c.mode == "text" else None
    by_depth = attention_by_depth(model, tok, c.mode, hay, c.n_needles, c.depths, length, c.trials, c.seed)
    res = {"run": str(run.dir), "step": run.checkpoint(c.step).step, "arch": mcfg.arch, "model": mcfg.name,
           "mode": c.mode, "length": length, "n_needles": c.n_needles,
           "normalisation": mcfg.variant.map_normalisation, "by_depth": by_depth}
    reports = [layer.attn.report() for layer in model.layers]  # per-layer values the variant reports (Diff: lambda)
    res.update({key: [r[key] for r in reports] for key in reports[0]})
    rows = [[f"{float(d):g}%", "mean"] + [np.mean(v["answer"]), np.mean(v["noise"])] for d, v in by_depth.items()]
    rows += [[f"{float(d):g}%", f"layer {i}", a, nz] for d, v in by_depth.items()
             for i, (a, nz) in enumerate(zip(v["answer"], v["noise"]))]
    table = markdown(["depth", "layer", "attention to answer", "attention noise"], rows)
    folder = out_dir(c.out, run.dir)
    write_json(folder / "attention.json", res)
    (folder / "attention.md").write_text(table + "\n")
    print(table)
    for key in reports[0]:
        say(f"{key} per layer: " + ", ".join(f"{x:.3f}" for x in res[key]))
    say(f"wrote {folder}/attention.{{json,md}}")
    return res


def main(argv: Optional[list[str]] = None) -> None:
    cli("eval attention", AttentionConfig, run_attention, argv)


if __name__ == "__main__":
    main()
