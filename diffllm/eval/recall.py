"""`diffllm eval recall`: associative-recall accuracy (the `recall` training task, diffllm/data/recall.py) on its
held-out split, by N pairs x gap x length, with bootstrap intervals over prompts.

A prompt is one held-out document (split=test: binding sets no training document holds) for fixed N, gap and length,
tokenized as the packer tokenizes it (each segment on its own) after an EOS (what precedes a packed document), ids
= [EOS] + tokens. A query is correct when every token of its value is the argmax at its position, teacher-forced: one
forward per prompt scores all N queries at once (eval needle's verdict, which equals greedy decoding).

    accuracy(cell)  = sum over the cell's prompts of correct queries / sum of queries  (N queries per prompt)
    interval(cell)  = the (1 - level)/2 and (1 + level)/2 quantiles of that ratio over `bootstrap` resamples of the
                      cell's prompts with replacement (prompts, not queries, are the independent draws)
by_n pools the cells of one N (every cell has `trials` prompts of N queries, so it is also the mean of their
accuracies), and `mean` pools every query of the grid (N=8 weighs four times N=2), each with its own interval.

A separate command from eval needle: the grid's axes (gap, not depth), the prompts (the training generator's held-out
documents, not haystacks with needles) and the bootstrap differ; the verdict is shared (needle.answers_correct).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from ..config import run_key_values
from ..data.recall import recall_document
from .common import EvalError, load_run, out_dir, say, write_report
from .config import RecallConfig, RecallTask  # noqa: F401 - the configs live apart, light for --help
from .needle import answers_correct


@dataclass
class RecallPrompt:
    ids: List[int]  # [EOS] + the document's tokens
    answers: List[tuple]  # [start, end) of each query's value tokens in ids
    pairs: List[tuple]  # [start, end) of the context's pair " k v" that each query asks for (answers' order)
    question: int  # index of the first query token: ids[:question] is the context (filler and pairs)


def recall_prompt(tok, doc) -> RecallPrompt:
    """Tokenize a Marked recall document segment by segment, as the packer does; the marked segments are answers,
    the segment before each its key " k", and the context segment " k v" (their text joined) its pair."""
    ids, spans = [tok.eos_id], []
    for text, _ in doc.parts:
        piece = tok.encode(text)
        spans.append((len(ids), len(ids) + len(piece)))
        ids += piece
    texts = [text for text, _ in doc.parts]
    marked = [i for i, (_, counts) in enumerate(doc.parts) if counts]
    pairs = [spans[texts.index(texts[i - 1] + texts[i])] for i in marked]  # keys are unique: the first is the pair
    return RecallPrompt(ids, [spans[i] for i in marked], pairs, spans[marked[0] - 1][0])


def bootstrap_interval(hits: np.ndarray, counts: np.ndarray, reps: int, level: float, seed) -> tuple:
    """(lo, hi): quantiles of sum(hits[i]) / sum(counts[i]) over `reps` resamples i of the prompts with replacement."""
    if reps < 1:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(hits), size=(reps, len(hits)))  # (reps, P)
    stats = hits[idx].sum(1) / counts[idx].sum(1)
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def task_prompts(task: RecallTask, tok, max_seq_len: int) -> dict:
    """{(n, gap, length): [RecallPrompt, ...]}, each cell seeded on its own, every prompt within the model's context."""
    task.validate()
    cells = {}
    for n in task.n:
        for gap in task.gaps:
            for length in task.lengths:
                rng = np.random.default_rng([task.seed, n, gap, length])
                cells[(n, gap, length)] = [
                    recall_prompt(tok, recall_document(rng, n, gap, length, "test")) for _ in range(task.trials)
                ]
                longest = max(len(p.ids) - 1 for p in cells[(n, gap, length)])
                if longest > max_seq_len:
                    raise EvalError(
                        f"length={length}: {length} words are {longest} tokens here, more than the "
                        f"model's context ({max_seq_len})"
                    )
    return cells


def recall_accuracy(model: torch.nn.Module, tok, task: RecallTask) -> dict:
    """{"cells": [{n, gap, length, accuracy, lo, hi, prompts, queries}], "by_n": {n: acc}, "by_n_interval":
    {n: [lo, hi]}, "mean", "interval"} for a model in memory (`model(ids)` -> logits, `model.cfg.max_seq_len`)."""
    per: dict = {}  # (n, gap, length) -> (hits per prompt, queries per prompt)
    for key, prompts in task_prompts(task, tok, model.cfg.max_seq_len).items():
        verdicts = answers_correct(model, prompts, task.batch_size)
        per[key] = (np.array([sum(v) for v in verdicts]), np.array([len(v) for v in verdicts]))

    def summary(keys: list, seed: list) -> tuple:
        hits = np.concatenate([per[k][0] for k in keys])
        counts = np.concatenate([per[k][1] for k in keys])
        return float(hits.sum() / counts.sum()), bootstrap_interval(hits, counts, task.bootstrap, task.level, seed)

    cells = []
    for i, (n, gap, length) in enumerate(per):
        acc, (lo, hi) = summary([(n, gap, length)], [task.seed, 0, i])
        cells.append(
            {
                "n": n,
                "gap": gap,
                "length": length,
                "accuracy": acc,
                "lo": lo,
                "hi": hi,
                "prompts": task.trials,
                "queries": int(per[(n, gap, length)][1].sum()),
            }
        )
    by_n, by_n_interval = {}, {}
    for n in task.n:
        by_n[n], by_n_interval[n] = summary([k for k in per if k[0] == n], [task.seed, 1, n])
    mean, interval = summary(list(per), [task.seed, 2])
    return {
        "cells": cells,
        "by_n": by_n,
        "by_n_interval": by_n_interval,
        "mean": mean,
        "interval": interval,
        "level": task.level,
        "bootstrap": task.bootstrap,
    }


def recall_table(res: dict) -> str:
    """Rows N x gap, columns length: accuracy [lo, hi]; then one row per N (all gaps and lengths) and the total."""
    from .report import markdown

    lengths = sorted({c["length"] for c in res["cells"]})
    acc = {(c["n"], c["gap"], c["length"]): c for c in res["cells"]}

    def show(a: float, lo: float, hi: float) -> str:
        return f"{a:.3f}" if np.isnan(lo) else f"{a:.3f} [{lo:.2f}, {hi:.2f}]"

    rows = [
        [n, gap] + [show(acc[(n, gap, x)]["accuracy"], acc[(n, gap, x)]["lo"], acc[(n, gap, x)]["hi"]) for x in lengths]
        for n, gap in sorted({(c["n"], c["gap"]) for c in res["cells"]})
    ]
    rows += [
        [n, "all"] + [show(a, *res["by_n_interval"][n])] + [""] * (len(lengths) - 1) for n, a in res["by_n"].items()
    ]
    rows.append(["all", "all", show(res["mean"], *res["interval"])] + [""] * (len(lengths) - 1))
    return markdown(["N", "gap"] + [f"length {x}" for x in lengths], rows)


def run_recall(c: RecallConfig) -> dict:
    c.validate()  # before the run is loaded
    run, mcfg, model, tok = load_run(c.run, c.step)
    task = RecallTask(**{k: getattr(c, k) for k in RecallTask.__dataclass_fields__})
    res = recall_accuracy(model, tok, task)
    res.update(run=str(run.dir), step=run.checkpoint(c.step).step, arch=mcfg.arch, model=mcfg.name, trials=c.trials)
    folder = out_dir(c.out, run.dir)
    write_report(folder, "recall", res, recall_table(res))
    lo, hi = res["interval"]
    say(
        f"accuracy {res['mean']:.3f} [{lo:.3f}, {hi:.3f}] "
        f"({', '.join(f'N={n}: {a:.2f}' for n, a in res['by_n'].items())}"
        f"); wrote {folder}/recall.{{json,md}}"
    )
    return res


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval recall", RecallConfig, run_recall, argv)


if __name__ == "__main__":
    main()
