"""`diffllm eval needle`: multi-needle retrieval after the Diff Transformer paper (§3.4), which follows LWM's format.

N needles sit in a haystack of `length` tokens; the first queried needle (the answer needle) at `depth` % of the
haystack, the others at random places; R of the N keys are then queried. Two haystacks:
  text       needles "The special magic {city} number is: {7-digit number}." between lines of real text (a data
             config's held-out documents); queried as "What is the special magic {city} number? The special magic
             {city} number is:" -> " {number}"
  synthetic  filler words and needles " magic {key} is {value} ." (diffllm/data/needle.py, which micro models can
             learn from the `needle` training source); queried as " magic {key} is" -> " {value}"
A query is correct when greedy decoding reproduces the answer's tokens, checked teacher-forced: every answer token is
the argmax at its position (one batched forward per prompt set instead of a decode loop; the same verdict, since a
greedy decoder emits exactly those tokens). LWM counts the number appearing anywhere in the output: stricter here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import torch

from ..config import run_key_values
from ..data.needle import FILLER, KEYS, LINK, MARK, VALUES, needle_phrase
from .common import EvalError, load_run, out_dir, padded, say, write_report
from .config import CITIES, MODES, NeedleConfig, NeedleTask  # noqa: F401 - the configs live apart, light for --help


@dataclass
class Prompt:
    """One retrieval prompt, teacher-forced: ids = haystack with needles, then each query followed by its answer."""

    ids: List[int]
    answers: List[tuple]  # [start, end) of each query's answer tokens in ids
    needle: tuple  # [start, end) of the answer needle (the first query's) in ids
    needles: List[tuple]  # [start, end) of every needle, in order
    question: int  # index of the first query token: ids[:question] is the context
    keys: List[str] = field(default_factory=list)  # the queried keys, in order


class Format:
    """Token pieces of one haystack mode: needles, queries, answers, and where a needle may be inserted."""

    def __init__(self, mode: str, tok):
        self.mode, self.tok = mode, tok
        self._cache: dict = {}

    def enc(self, text: str) -> List[int]:
        if text not in self._cache:
            self._cache[text] = self.tok.encode(text)
        return self._cache[text]

    def pair(self, rng: np.random.Generator, n: int) -> tuple[list, list]:
        if self.mode == "synthetic":
            return [KEYS[i] for i in rng.choice(len(KEYS), n, replace=False)], [
                VALUES[i] for i in rng.integers(0, len(VALUES), n)
            ]
        return [CITIES[i] for i in rng.choice(len(CITIES), n, replace=False)], [
            str(x) for x in rng.integers(1_000_000, 10_000_000, n)
        ]

    def needle(self, key: str, value: str) -> List[int]:
        if self.mode == "synthetic":
            return self.enc(needle_phrase(key, value))
        return self.enc(f"\nThe special magic {key} number is: ") + self.enc(f"{value}.\n")

    def query(self, key: str, value: str) -> tuple[List[int], List[int], List[int]]:
        """(question, answer, closing) tokens."""
        if self.mode == "synthetic":
            return self.enc(f" {MARK} {key} {LINK}"), self.enc(f" {value}"), self.enc(f" {'.'}")
        return (
            self.enc(f"\nWhat is the special magic {key} number? The special magic {key} number is:"),
            self.enc(f" {value}"),
            self.enc("."),
        )

    def filler(self, rng: np.random.Generator, n_tokens: int) -> List[int]:
        ids: List[int] = []
        while len(ids) < n_tokens:
            ids += self.enc(" " + FILLER[int(rng.integers(len(FILLER)))])
        return ids[:n_tokens]

    def boundaries(self, hay: List[int]) -> List[int]:
        """Insertion points: before a word (synthetic) or after a line break (text); always 0 and len(hay)."""
        pieces = [self.tok.decode([t]) for t in hay]
        if self.mode == "synthetic":
            cuts = [i for i, p in enumerate(pieces) if p.startswith(" ")]
        else:
            cuts = [i + 1 for i, p in enumerate(pieces) if "\n" in p]
        return sorted({0, len(hay), *cuts})


def build_prompt(
    fmt: Format, haystack: Optional[List[int]], n: int, r: int, depth: float, length: int, rng: np.random.Generator
) -> Prompt:
    """A prompt of exactly `length` tokens: N needles, the answer needle at `depth` % of the haystack, R queries."""
    keys, values = fmt.pair(rng, n)
    needles = [fmt.needle(k, v) for k, v in zip(keys, values)]
    asked = [0] + list(rng.choice(np.arange(1, n), r - 1, replace=False)) if r > 1 else [0]
    queries = [fmt.query(keys[a], values[a]) for a in asked]
    fixed = sum(map(len, needles)) + sum(len(q) + len(a) + len(c) for q, a, c in queries)
    room = length - fixed
    if room < 1:
        raise EvalError(f"lengths: {length} tokens cannot hold {n} needles and {r} queries ({fixed} tokens)")
    if haystack is None:
        hay = fmt.filler(rng, room)
    else:
        if len(haystack) < room:
            raise EvalError(f"data: the haystack text has {len(haystack)} tokens, fewer than the {room} needed")
        start = int(rng.integers(0, len(haystack) - room + 1))
        hay = list(haystack[start : start + room])
    cuts = fmt.boundaries(hay)
    target = depth / 100 * len(hay)
    spots = [min(cuts, key=lambda c: abs(c - target))] + [int(c) for c in rng.choice(cuts, n - 1)]
    ids: List[int] = []
    spans: dict = {}
    prev = 0
    for i in sorted(range(n), key=lambda i: (spots[i], i)):  # needles in haystack order
        ids += hay[prev : spots[i]]
        prev = spots[i]
        spans[i] = (len(ids), len(ids) + len(needles[i]))
        ids += needles[i]
    ids += hay[prev:]
    question, answers = len(ids), []
    for q, a, c in queries:
        ids += q
        answers.append((len(ids), len(ids) + len(a)))
        ids += a + c
    return Prompt(ids, answers, spans[0], sorted(spans.values()), question, [keys[a] for a in asked])


@torch.inference_mode()
def answers_correct(model: torch.nn.Module, prompts: List[Prompt], batch_size: int = 8) -> List[List[bool]]:
    """Per prompt, per query: is every answer token the argmax at its position (greedy decoding would emit it)?"""
    out = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        pred = model(padded([p.ids for p in chunk])[:, :-1]).argmax(-1)  # (B, W-1): the greedy next token
        for j, p in enumerate(chunk):
            out.append([bool((pred[j, s - 1 : e - 1] == torch.tensor(p.ids[s:e])).all()) for s, e in p.answers])
    return out


def task_prompts(task: NeedleTask, tok, max_seq_len: int, haystack: Optional[List[int]] = None) -> dict:
    """{(n, depth, length): [Prompt, ...]} for the whole grid, each cell seeded on its own."""
    task.validate()
    if task.mode == "text" and haystack is None:
        raise EvalError("mode=text needs haystack text (data=...)")
    fmt = Format(task.mode, tok)
    cells = {}
    for n in task.n_needles:
        for length in task.resolved_lengths(max_seq_len):
            for depth in task.depths:
                rng = np.random.default_rng([task.seed, n, length, int(depth * 100)])
                cells[(n, depth, length)] = [
                    build_prompt(fmt, haystack, n, min(task.queries, n), depth, length, rng) for _ in range(task.trials)
                ]
    return cells


def needle_accuracy(model: torch.nn.Module, tok, task: NeedleTask, haystack: Optional[List[int]] = None) -> dict:
    """{"cells": [{n, depth, length, accuracy}], "by_n": {n: mean}, "mean": overall} for a model in memory."""
    cells = []
    for (n, depth, length), prompts in task_prompts(task, tok, model.cfg.max_seq_len, haystack).items():
        hits = [h for row in answers_correct(model, prompts, task.batch_size) for h in row]
        cells.append({"n": n, "depth": depth, "length": length, "accuracy": sum(hits) / len(hits)})
    by_n = {n: float(np.mean([c["accuracy"] for c in cells if c["n"] == n])) for n in task.n_needles}
    return {"cells": cells, "by_n": by_n, "mean": float(np.mean([c["accuracy"] for c in cells]))}


def haystack_tokens(run_config: Optional[dict], data: Any, tok, n_tokens: int) -> List[int]:
    """Real text for mode=text: the first documents of a data config's held-out sources (default: the run's)."""
    from .ppl import eval_sources, source_docs

    docs, _ = source_docs(tok, eval_sources(run_config, data)[0], n_tokens)
    return [t for d in docs for t in d]


def run_needle(c: NeedleConfig) -> dict:
    from .report import needle_heatmap, needle_table

    def check(run, mcfg) -> None:  # the arguments, before the weights are gathered
        c.validate()
        c.resolved_lengths(mcfg.max_seq_len)
        if c.mode == "text":
            from .ppl import eval_sources

            eval_sources(run.config(), c.data)  # a data config that does not exist, a glob that matches nothing

    run, mcfg, model, tok = load_run(c.run, c.step, check)
    hay = haystack_tokens(run.config(), c.data, tok, 4 * mcfg.max_seq_len) if c.mode == "text" else None
    task = NeedleTask(**{k: getattr(c, k) for k in NeedleTask.__dataclass_fields__})
    res = needle_accuracy(model, tok, task, hay)
    res.update(
        run=str(run.dir),
        step=run.checkpoint(c.step).step,
        arch=mcfg.arch,
        model=mcfg.name,
        mode=c.mode,
        queries=c.queries,
        trials=c.trials,
    )
    folder = out_dir(c.out, run.dir)
    write_report(folder, f"needle-{c.mode}", res, needle_table(res))
    needle_heatmap(res, folder / f"needle-{c.mode}.png")
    say(
        f"mean accuracy {res['mean']:.3f} ({', '.join(f'N={n}: {a:.2f}' for n, a in res['by_n'].items())}); "
        f"wrote {folder}/needle-{c.mode}.{{json,md,png}}"
    )
    return res


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval needle", NeedleConfig, run_needle, argv)


if __name__ == "__main__":
    main()
