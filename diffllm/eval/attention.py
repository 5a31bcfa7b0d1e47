"""`diffllm eval attention`: where the answer position looks in retrieval prompts (the paper's Table 3).

For needle prompts (one needle per prompt by default) with the answer needle at each depth, the attention row of the
position that predicts the first answer token, per layer, averaged over heads and prompts:
  answer  the mass on the answer needle's tokens
  noise   the mass on the rest of the context (the haystack and the other needles; the query tokens are neither)
Transformer rows are softmax rows (they sum to 1). Diff rows are the differential map (A1 - lambda A2) / (1 - lambda):
they also sum to 1, and entries may be negative. Each variant says how its map is rebuilt (see maps.py) and what it
reports per layer beside it (Diff: lambda).

task=recall reads the same rows on the associative-recall task's held-out prompts (eval recall's prompts: split=test,
fixed N pairs, gap and length in words, `trials` per cell), at every query's predicting position (the token before
its value), averaged over all queries of the cell's prompts:
  answer  the mass on the queried key's pair " k v" in the context
  noise   the mass on the rest of the context (filler and the other pairs; the query section, earlier queries and
          answers and the key itself, is neither)
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import numpy as np
import torch

from ..config import run_key_values
from .common import EvalError, load_run, out_dir, say, write_json
from .config import AttentionConfig
from .maps import attention_map, capture
from .needle import Format, build_prompt, haystack_tokens
from .recall import RecallPrompt, RecallTask, task_prompts

TASKS = ("needle", "recall")


class Probe(NamedTuple):
    """One attention row to read: position `pos` of a prompt; answer = its mass on ids[start:end], noise = its mass
    on the rest of ids[:context]."""

    pos: int
    answer: tuple  # [start, end)
    context: int


def needle_probes(p) -> List[Probe]:
    """The position predicting the first answer token; the answer needle; the context before the first query."""
    return [Probe(p.answers[0][0] - 1, p.needle, p.question)]


def recall_probes(p: RecallPrompt) -> List[Probe]:
    """Each query's position before its value; the queried pair; the context before the query section."""
    return [Probe(s - 1, pair, p.question) for (s, _), pair in zip(p.answers, p.pairs)]


@torch.inference_mode()
def row_masses(model: torch.nn.Module, prompts: List[tuple]) -> dict:
    """{"answer": [per layer], "noise": [per layer]}: mean over every probe of (ids, [Probe, ...]) prompts, one forward
    per prompt (up to its last probe: causal rows do not see what follows)."""
    n_layers = len(model.layers)
    answer, noise, count = np.zeros(n_layers), np.zeros(n_layers), 0
    for ids, probes in prompts:
        pos = [p.pos for p in probes]
        with capture(model) as got:
            model(torch.tensor([ids[: max(pos) + 1]]))
        for i, (layer, (x, cos, sin)) in enumerate(zip(model.layers, got["inputs"])):
            rows = attention_map(layer.attn, x, cos, sin)[0, :, pos].mean(0)  # (P, T): mean over heads
            for row, p in zip(rows, probes):
                a = float(row[p.answer[0] : p.answer[1]].sum())
                answer[i] += a
                noise[i] += float(row[: p.context].sum()) - a
        count += len(probes)
    return {"answer": (answer / count).tolist(), "noise": (noise / count).tolist()}


def allocation(model: torch.nn.Module, prompts: list) -> dict:
    """Needle prompts: mean attention mass from each prompt's answer position."""
    return row_masses(model, [(p.ids, needle_probes(p)) for p in prompts])


def recall_allocation(model: torch.nn.Module, prompts: List[RecallPrompt]) -> dict:
    """Recall prompts: mean attention mass from every query's answer position."""
    return row_masses(model, [(p.ids, recall_probes(p)) for p in prompts])


def attention_by_depth(
    model, tok, mode: str, haystack, n: int, depths: list, length: int, trials: int, seed: int
) -> dict:
    """{depth: {"answer": [...], "noise": [...]}} for a model in memory."""
    fmt = Format(mode, tok)
    out = {}
    for depth in depths:
        rng = np.random.default_rng([seed, n, length, int(depth * 100)])
        prompts = [build_prompt(fmt, haystack, n, 1, depth, length, rng) for _ in range(trials)]
        out[str(depth)] = allocation(model, prompts)
    return out


def attention_by_cell(model, tok, task: RecallTask) -> list:
    """[{"n", "gap", "length", "queries", "answer": [...], "noise": [...]}] for a model in memory, one per N x gap x
    length of `task` (eval recall's prompts: the same seed gives the same prompts)."""
    cells = task_prompts(task, tok, model.cfg.max_seq_len)  # validates: one-line EvalErrors
    return [
        {
            "n": n,
            "gap": gap,
            "length": length,
            "queries": sum(len(p.answers) for p in prompts),
            **recall_allocation(model, prompts),
        }
        for (n, gap, length), prompts in cells.items()
    ]


def allocation_table(keys: List[str], cells: List[tuple]) -> str:
    """Markdown: per cell (labels, {"answer", "noise"}) its mean over layers, then every cell's rows per layer."""
    from .report import markdown

    rows = [labels + ["mean", np.mean(v["answer"]), np.mean(v["noise"])] for labels, v in cells]
    rows += [
        labels + [f"layer {i}", a, nz] for labels, v in cells for i, (a, nz) in enumerate(zip(v["answer"], v["noise"]))
    ]
    return markdown(keys + ["layer", "attention to answer", "attention noise"], rows)


def needle_attention(c: AttentionConfig, run, mcfg, model, tok) -> tuple[dict, dict, str]:
    """(settings, results, table) of task=needle."""
    length = c.length or mcfg.max_seq_len
    hay = haystack_tokens(run.config(), c.data, tok, 4 * length) if c.mode == "text" else None
    by_depth = attention_by_depth(model, tok, c.mode, hay, c.n_needles, c.depths, length, c.trials, c.seed)
    settings = {"mode": c.mode, "length": length, "n_needles": c.n_needles}
    table = allocation_table(["depth"], [([f"{float(d):g}%"], v) for d, v in by_depth.items()])
    return settings, {"by_depth": by_depth}, table


def recall_attention(c: AttentionConfig, run, mcfg, model, tok) -> tuple[dict, dict, str]:
    """(settings, results, table) of task=recall."""
    task = RecallTask(n=c.n, gaps=c.gaps, lengths=[c.length or RecallTask().lengths[0]], trials=c.trials, seed=c.seed)
    cells = attention_by_cell(model, tok, task)
    settings = {"task": "recall", "length": task.lengths[0], "trials": c.trials}
    return settings, {"cells": cells}, allocation_table(["N", "gap"], [([v["n"], v["gap"]], v) for v in cells])


def run_attention(c: AttentionConfig) -> dict:
    def check(run, mcfg) -> None:  # the arguments, before the weights are gathered
        if c.task not in TASKS:
            raise EvalError(f"task={c.task!r}: expected one of {TASKS}")
        if c.task == "needle" and c.mode not in ("synthetic", "text"):
            raise EvalError(f"mode={c.mode!r}: expected one of ('synthetic', 'text')")
        if c.task == "needle" and (c.length or mcfg.max_seq_len) > mcfg.max_seq_len:  # (recall's length is in words)
            raise EvalError(f"length={c.length}: exceeds the model's context ({mcfg.max_seq_len})")

    run, mcfg, model, tok = load_run(c.run, c.step, check)
    settings, results, table = (recall_attention if c.task == "recall" else needle_attention)(c, run, mcfg, model, tok)
    res = {
        "run": str(run.dir),
        "step": run.checkpoint(c.step).step,
        "arch": mcfg.arch,
        "model": mcfg.name,
        **settings,
        "normalisation": mcfg.variant.map_normalisation,
        **results,
    }
    reports = [layer.attn.report() for layer in model.layers]  # per-layer values the variant reports (Diff: lambda)
    res.update({key: [r[key] for r in reports] for key in reports[0]})
    name = "attention" if c.task == "needle" else f"attention-{c.task}"  # compare reads attention.json as the needle's
    folder = out_dir(c.out, run.dir)
    write_json(folder / f"{name}.json", res)
    (folder / f"{name}.md").write_text(table + "\n")
    print(table)
    for key in reports[0]:
        say(f"{key} per layer: " + ", ".join(f"{x:.3f}" for x in res[key]))
    say(f"wrote {folder}/{name}.{{json,md}}")
    return res


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval attention", AttentionConfig, run_attention, argv)


if __name__ == "__main__":
    main()
