"""The shipped plays_cloze task (diffllm/eval/tasks/plays_cloze: three lines of a held-out play, which of four lines
comes next; chance 0.25) scored without lm-eval, as `eval lm-eval` scores it: each choice's log-likelihood after its
context (lm-eval's context/continuation split: the continuation is what encoding context + "\\n" + choice adds to the
context's tokens), by common.score_continuations; the prediction is the best choice (the first on a tie), lm-eval's
`acc`.

The sequences are batched by equal length, never padded: a map's quantisation scale (eval outliers) is the absmax of
its causal entries, and padded rows would change it, so a choice's score would depend on its batch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import List

from .common import score_continuations

TASK = "plays_cloze"


@dataclass
class Item:
    context: str
    choices: List[str]
    label: int


def items(n: int) -> List[Item]:
    """The task's first n items (n larger than the task: all 300)."""
    from .harness import TASKS_DIR

    lines = (TASKS_DIR / TASK / f"{TASK}.jsonl").read_text().splitlines()[:n]
    return [Item(d["context"], d["choices"], d["label"]) for d in map(json.loads, lines)]


def choice_pairs(tok, it: Item) -> List[tuple[List[int], List[int]]]:
    """(context tokens, continuation tokens) of each choice: lm-eval's TemplateLM._encode_pair of (context,
    "\\n" + choice), the task's target_delimiter."""
    context = it.context.rstrip()
    moved = it.context[len(context) :]  # trailing whitespace goes with the continuation, as lm-eval moves it
    ctx = tok.encode(context)
    return [(ctx, tok.encode(context + moved + "\n" + c)[len(ctx) :]) for c in it.choices]


def unpadded_scores(model, pairs: list, max_len: int, batch_size: int) -> List[float]:
    """score_continuations' log-likelihood of each pair, in order, each batch of sequences of one length."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, (ctx, cont) in enumerate(pairs):
        by_length[min(len(ctx) + len(cont), max_len + 1)].append(i)
    out = [0.0] * len(pairs)
    for group in by_length.values():
        for i, (ll, _) in zip(group, score_continuations(model, [pairs[i] for i in group], max_len, batch_size)):
            out[i] = ll
    return out


def accuracy(model, tok, task: List[Item], batch_size: int = 16) -> float:
    """The share of items whose best-scoring choice is the labelled one."""
    pairs = [p for it in task for p in choice_pairs(tok, it)]
    scores = unpadded_scores(model, pairs, model.cfg.max_seq_len, batch_size)
    right, start = 0, 0
    for it in task:
        mine = scores[start : start + len(it.choices)]
        right += mine.index(max(mine)) == it.label
        start += len(it.choices)
    return right / len(task)
