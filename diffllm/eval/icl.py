"""`diffllm eval icl`: many-shot in-context classification and its robustness to the order of the demonstrations (the
paper's §3.6, Figures 6 and 7).

A prompt for query i with k demonstrations is  EOS demo_1 ... demo_k query, each demonstration the template filled with
an example's text and label (tokenized on its own, as the packer tokenizes segments), the query the template up to
its label. Each label string is scored by the summed log-probability of its tokens after the prompt (the whitespace
before `{label}` in the template goes with the label: "Label:" + " yes"); the prediction is the best-scoring label
(the first on a tie), never generated. Accuracy over the queries, with a bootstrap interval over queries.

`permutations=P` scores each query's same k demonstrations in P orders (order 0: as drawn; the others seeded shuffles)
and reports the mean, std, min and max of the P accuracies; the headline interval resamples queries, each counted by
its share of correct orders. k is a list of counts or `max` (the largest k whose every prompt fits `seq_len`); a k
whose prompts do not fit is a one-line error naming k and the lengths: prompts are never cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ..config import run_key_values
from .common import EvalError, load_run, out_dir, say, write_report

if TYPE_CHECKING:
    import numpy as np

    from .icl_tasks import Task


@dataclass
class IclConfig:
    """k-shot classification accuracy by k, scored by the labels' log-likelihood, over P orders of the demonstrations.
    task: a builtin (synthetic: a word -> label mapping drawn per prompt) or a local .jsonl/.parquet file or
    datasets save_to_disk folder with text and label fields."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    task: str = "synthetic"  # synthetic | a .jsonl/.parquet file | a datasets save_to_disk folder
    text_field: str = "text"  # the field of a task file that holds an example's input
    label_field: str = "label"  # the field of a task file that holds its label (a string, or an integer)
    label_names: Optional[List[str]] = None  # integer labels' strings; null: a ClassLabel's names, or string labels
    template: str = r"Input: {text}\nLabel: {label}\n"  # a demonstration (\n, \t: newline, tab); the query is the
    # part before {label}
    k: Any = field(default_factory=lambda: [0, 1, 4, 16])  # demonstrations per prompt: a list, with `max` allowed
    permutations: int = 1  # orders of the same demonstrations per k
    queries: int = 64  # query examples
    seq_len: Optional[int] = None  # the context prompts must fit; null: the run's data.seq_len
    seed: int = 0  # which queries and demonstrations, and the orders
    batch_size: int = 16  # sequences (prompt + one label) per forward
    bootstrap: int = 1000  # resamples for the intervals (0: none)
    level: float = 0.95  # the intervals' confidence level
    out: Optional[str] = None  # folder for icl-<task>.{json,md}; null: <run>/eval


@dataclass
class Prompts:
    """A task tokenized: each query's tokens (the template up to its label) and gold label, each query's demonstrations'
    tokens in draw order, and each label's tokens."""

    queries: List[List[int]]
    gold: List[int]
    demos: List[List[List[int]]]
    labels: List[List[int]]
    eos: int
    encode: Callable[[str, int], List[int]]  # a demonstration (text, label id) -> its tokens (cached)

    def length(self, i: int, k: int) -> int:
        """The model's input length of query i's k-shot prompt with its longest label: EOS + demos + query + label - 1
        (the last label token is only a target)."""
        return sum(len(d) for d in self.demos[i][:k]) + len(self.queries[i]) + max(len(t) for t in self.labels)

    def ids(self, i: int, order: List[int]) -> List[int]:
        """EOS, the demonstrations in `order`, the query: the prompt before a label."""
        return [self.eos] + [t for j in order for t in self.demos[i][j]] + self.queries[i]


def unescape(template: str) -> str:
    """The template as typed (`\\n`, `\\t` as a command line can write them) -> its text."""
    return template.replace("\\n", "\n").replace("\\t", "\t")


def fill(template: str, text: str, label: str) -> str:
    return template.replace("{label}", label).replace("{text}", text)


def split_template(template: str) -> tuple[str, str]:
    """(the query's template: up to {label}, spaces stripped; the whitespace that goes before each label)."""
    if "{text}" not in template or "{label}" not in template or template.index("{text}") > template.index("{label}"):
        raise EvalError(f"template={template!r}: needs {{text}} and then {{label}}")
    head = template.split("{label}", 1)[0]
    query = head.rstrip(" ")
    return query, head[len(query) :]


def tokenize(task: Task, tok, template: str, demos_needed: int) -> Prompts:
    """The task's token ids; each query's first `demos_needed` demonstrations, each distinct one tokenized once (the
    synthetic task repeats a few)."""
    template = unescape(template)
    query_t, space = split_template(template)
    cache: dict[tuple, List[int]] = {}

    def enc(text: str, y: int) -> List[int]:
        if (text, y) not in cache:
            cache[(text, y)] = tok.encode(fill(template, text, task.labels[y]))
        return cache[(text, y)]

    p = Prompts(
        queries=[tok.encode(fill(query_t, e.query[0], "")) for e in task.episodes],
        gold=[e.query[1] for e in task.episodes],
        demos=[],
        labels=[tok.encode(space + label) for label in task.labels],
        eos=tok.eos_id,
        encode=enc,
    )
    p.demos = [[enc(*d) for d in e.demos[:demos_needed]] for e in task.episodes]
    return p


def fit_max(p: Prompts, task: Task, seq_len: int) -> int:
    """The largest k at which every query's prompt fits seq_len, each query's demonstrations tokenized as far as
    needed (p.demos grows to hold them)."""
    best = None
    for i, e in enumerate(task.episodes):
        k = 0
        while k < len(e.demos) and (best is None or k < best):
            if k == len(p.demos[i]):
                p.demos[i].append(p.encode(*e.demos[k]))
            if p.length(i, k + 1) > seq_len:
                break
            k += 1
        best = k if best is None else min(best, k)
    return best or 0


def resolve_ks(k: Any) -> List[Any]:
    ks = k if isinstance(k, (list, tuple)) else [k]
    for x in ks:
        if x != "max" and (not isinstance(x, int) or isinstance(x, bool) or x < 0):
            raise EvalError(f"k={x}: want a count >= 0 or max")
    if not ks:
        raise EvalError("k: empty; pass k=[0,1,4] or k=max")
    return list(ks)


def check_fits(p: Prompts, task: Task, k: int, seq_len: int) -> None:
    """Every query has k demonstrations and its k-shot prompt fits seq_len; else a one-line EvalError."""
    fewest = min(len(e.demos) for e in task.episodes)
    if k > fewest:
        raise EvalError(f"k={k}: the task has only {fewest} demonstrations per query")
    lengths = [p.length(i, k) for i in range(len(p.queries))]
    worst = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[worst] > seq_len:
        raise EvalError(
            f"k={k}: the prompt of query {worst} is {lengths[worst]} tokens "
            f"({sum(len(d) for d in p.demos[worst][:k])} in demonstrations, {len(p.queries[worst])} in the query, "
            f"{max(len(t) for t in p.labels)} in the longest label), longer than seq_len={seq_len}; "
            f"pass a smaller k or k=max"
        )


def orders(i: int, k: int, permutations: int, seed: int) -> List[List[int]]:
    """The P orders of query i's k demonstrations: as drawn, then seeded shuffles."""
    import numpy as np

    out = [list(range(k))]
    for q in range(1, permutations):
        out.append([int(j) for j in np.random.default_rng([seed, i, k, q]).permutation(k)])
    return out


def label_scores(model, prompts: List[List[int]], labels: List[List[int]], batch_size: int) -> np.ndarray:
    """(len(prompts), len(labels)) float64: sum of log p(label tokens | prompt) for every prompt and label, each
    prompt + label one right-padded sequence (a causal model's scores never see the padding)."""
    import numpy as np

    from .by_position import window_nll
    from .common import padded

    pairs = [(i, j) for i in range(len(prompts)) for j in range(len(labels))]
    out = np.zeros((len(prompts), len(labels)))
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s : s + batch_size]
        nll = window_nll(model, padded([prompts[i] + labels[j] for i, j in chunk])).numpy()  # (B, W-1)
        for row, (i, j) in enumerate(chunk):
            n = len(prompts[i])
            out[i, j] = -nll[row, n - 1 : n - 1 + len(labels[j])].sum()  # positions n-1.. predict the label
    return out


def summarise(correct: np.ndarray, bootstrap: int, level: float, seed: int) -> dict:
    """correct: (P, Q) bools, P orders of Q queries -> accuracy per order (its interval over queries) and across
    orders the mean, std, min, max, with the mean's interval over queries."""
    import numpy as np

    from .recall import bootstrap_interval

    P, Q = correct.shape
    accs = correct.mean(1)
    ones = np.ones(Q)
    return {
        "accuracy": float(accs.mean()),
        "interval": list(bootstrap_interval(correct.sum(0).astype(float), P * ones, bootstrap, level, seed)),
        "std": float(accs.std(ddof=1)) if P > 1 else 0.0,
        "min": float(accs.min()),
        "max": float(accs.max()),
        "by_order": [
            {"accuracy": float(a), "interval": list(bootstrap_interval(c.astype(float), ones, bootstrap, level, seed))}
            for a, c in zip(accs, correct)
        ],
    }


def evaluate(model, p: Prompts, k: int, permutations: int, seed: int, batch_size: int) -> np.ndarray:
    """(P, Q) bools: is the best-scoring label the gold one, for each order of each query's k-shot prompt."""
    import numpy as np

    P = permutations if k > 1 else 1  # 0 or 1 demonstration: one order (repeated P times)
    every = [orders(i, k, P, seed) for i in range(len(p.queries))]
    correct = np.zeros((P, len(p.queries)), dtype=bool)
    for q in range(P):
        scores = label_scores(model, [p.ids(i, every[i][q]) for i in range(len(p.queries))], p.labels, batch_size)
        correct[q] = scores.argmax(1) == np.asarray(p.gold)
    return correct if P == permutations else np.repeat(correct, permutations, axis=0)


def table(res: dict) -> str:
    from .report import markdown

    def span(lo: float, hi: float) -> str:
        return f"{lo:.3g}-{hi:.3g}"

    rows = [
        [k, r["accuracy"], span(*r["interval"]), r["std"], span(r["min"], r["max"]), r["prompt_tokens"]]
        for k, r in res["by_k"].items()
    ]
    head = ["k", "accuracy", f"{res['level']:.0%} interval", "std over orders", "min-max", "prompt tokens (max)"]
    return markdown(head, rows)


def run_icl(c: IclConfig) -> dict:
    from .icl_tasks import load_task

    ready: dict = {}

    def check(run, mcfg) -> None:  # the arguments and the prompts' lengths, before the weights are gathered
        if c.queries < 1 or c.permutations < 1 or c.batch_size < 1:
            raise EvalError("queries, permutations and batch_size must be >= 1")
        if c.bootstrap < 0 or not 0 < c.level < 1:
            raise EvalError(f"bootstrap={c.bootstrap}, level={c.level}: want bootstrap >= 0 and 0 < level < 1")
        ks = resolve_ks(c.k)
        split_template(c.template)
        seq_len = c.seq_len or ((run.config() or {}).get("data") or {}).get("seq_len") or mcfg.max_seq_len
        if seq_len > mcfg.max_seq_len or seq_len < 1:
            raise EvalError(f"seq_len={seq_len}: want 1 to the model's context ({mcfg.max_seq_len})")
        task = load_task(c.task, c.text_field, c.label_field, c.label_names, c.queries, c.seed)
        if len(task.labels) < 2:
            raise EvalError(f"task={c.task}: {len(task.labels)} label; classification needs at least 2")
        numbers = [x for x in ks if x != "max"]
        p = tokenize(task, run.tokenizer(), c.template, max(numbers, default=0))
        if "max" in ks:
            most = fit_max(p, task, seq_len)
            ks = [most if x == "max" else x for x in ks]
        ks = sorted(set(ks))
        for k in ks:
            check_fits(p, task, k, seq_len)
        ready.update(task=task, prompts=p, ks=ks, seq_len=seq_len)

    run, mcfg, model, _ = load_run(c.run, c.step, check)
    task, p = ready["task"], ready["prompts"]
    res: dict = {
        "run": str(run.dir),
        "step": run.checkpoint(c.step).step,
        "arch": mcfg.arch,
        "model": mcfg.name,
        "task": task.name,
        "labels": task.labels,
        "chance": 1 / len(task.labels),
        "queries": len(p.queries),
        "permutations": c.permutations,
        "seq_len": ready["seq_len"],
        "template": c.template,
        "level": c.level,
        "by_k": {},
    }
    for k in ready["ks"]:
        say(f"k={k}: {len(p.queries)} queries x {len(task.labels)} labels x {c.permutations if k > 1 else 1} orders")
        correct = evaluate(model, p, k, c.permutations, c.seed, c.batch_size)
        r = summarise(correct, c.bootstrap, c.level, c.seed)
        r["prompt_tokens"] = max(p.length(i, k) for i in range(len(p.queries)))
        res["by_k"][k] = r
    write_report(out_dir(c.out, run.dir), f"icl-{task.name}", res, table(res))
    say(f"wrote {out_dir(c.out, run.dir)}/icl-{task.name}.{{json,md}} (chance {res['chance']:.3g})")
    return res


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval icl", IclConfig, run_icl, argv)


if __name__ == "__main__":
    main()
