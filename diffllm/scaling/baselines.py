"""Reference baselines for a run: the unigram and count-based bigram cross-entropy (nats/token) of the validation
windows its trainer scores, with counts taken from exactly the training windows it consumed up to its budget.

All score the same target positions as `lm_loss`: in a window w of seq_len + 1 tokens, the targets w[1:] with the
contexts w[:-1]. Counts come from the training windows the same way: c(b) over targets, c(a, b) over (context,
target) pairs, c(a) = sum_b c(a, b). With V the tokenizer's vocabulary and N the training targets:

    unigram  p(b)   = (c(b) + 1) / (N + V)                                   (add-one)
    bigram   p(b|a) = (c(a, b) + K p(b)) / (c(a) + K),   K = BIGRAM_K        (interpolated with the unigram)
    kn3, kn4 interpolated Kneser-Ney 3- and 4-gram (kneser_ney.py), counts inside the training windows that start
             in their source's first pass: beyond one epoch a repeated window would count twice, and KN's discounts,
             estimated from the k-grams seen once and twice, would collapse (the 4-gram's loss rose above the bigram's)

The training windows are rebuilt from the run's config.yaml and tokenizer.json with the data pipeline itself
(diffllm/data: the same streams, seed and layout as its TrainLoader: rank r's micro-batch k comes from its
DataLoader worker k mod workers, whose slot serves its streams round-robin); the validation windows are every
packed window of the held-out set the run's final_val_loss covers (`held_out_windows`, trainer.val_tokens per
source). The numbers are cached in <sweep_dir>/.baselines/ by a
key of the data config, the tokenizer, the token budget and the data layout (the seed is in the data config).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from ..errors import UserError
from .kneser_ney import KneserNey

if TYPE_CHECKING:
    from ..results import RunRecord

BIGRAM_K = 20.0  # pseudo-count weight of the unigram in the bigram (see the module docstring and docs/scaling.md)
MAX_TOKENS = 50_000_000  # larger budgets are not counted here (minutes of reading and packing per 50M tokens)
VERSION = 3  # bump when the definition changes: old cache entries are then ignored
BASELINES_NOTE = (
    "Baselines (nats/token, on every packed window of the held-out set that final_val_loss covers; counts from "
    "the run's own "
    f"training windows up to its budget): unigram add-one; bigram p(b|a) = (c(a,b) + {BIGRAM_K:g}·"
    f"p_uni(b)) / (c(a) + {BIGRAM_K:g}); kn3, kn4: interpolated Kneser-Ney 3- and 4-gram (one discount "
    "n1/(n1+2n2) per order, diffllm/scaling/kneser_ney.py), counted on the training windows of the first pass "
    "over the data only (a repeated window would count twice). A run whose final_val_loss does not beat its bigram is "
    "marked under-trained."
)


@dataclass(frozen=True)
class Baselines:
    unigram: float
    bigram: float
    train_tokens: int  # training targets counted
    val_tokens: int  # validation targets scored
    vocab: int
    k: float = BIGRAM_K
    kn3: Optional[float] = None  # interpolated Kneser-Ney 3-gram (diffllm/scaling/kneser_ney.py); None: an older entry
    kn4: Optional[float] = None  # ... and 4-gram
    kn_train_tokens: Optional[int] = None  # training targets the Kneser-Ney counts read (the first pass only)


def cross_entropies(
    train: np.ndarray, val: np.ndarray, vocab: int, k: float = BIGRAM_K, first_pass: Optional[np.ndarray] = None
) -> Baselines:
    """train: (n, T+1) training windows; val: (m, T+1) validation windows (any integer dtype); first_pass: (n,) bool,
    the windows the Kneser-Ney counts read (None: all). Float64 throughout."""
    train, val = np.asarray(train, dtype=np.int64), np.asarray(val, dtype=np.int64)
    once = train if first_pass is None else train[np.asarray(first_pass, dtype=bool)]
    ctx, tgt = train[:, :-1].ravel(), train[:, 1:].ravel()
    uni = np.bincount(tgt, minlength=vocab).astype(np.float64)
    p_uni = (uni + 1.0) / (len(tgt) + vocab)  # (V,)
    pairs, pair_counts = np.unique(ctx * vocab + tgt, return_counts=True)  # sorted (context, target) ids
    c_ctx = np.bincount(ctx, minlength=vocab).astype(np.float64)
    a, b = val[:, :-1].ravel(), val[:, 1:].ravel()
    key = a * vocab + b
    at = np.minimum(np.searchsorted(pairs, key), len(pairs) - 1)
    c_ab = np.where(pairs[at] == key, pair_counts[at], 0).astype(np.float64)
    p_bi = (c_ab + k * p_uni[b]) / (c_ctx[a] + k)
    kn = {f"kn{n}": KneserNey(once, n, vocab).cross_entropy(val) if vocab**n < 2**63 else None for n in (3, 4)}
    return Baselines(
        float(-np.log(p_uni[b]).mean()),
        float(-np.log(p_bi).mean()),
        int(len(tgt)),
        int(len(b)),
        int(vocab),
        float(k),
        **kn,
        kn_train_tokens=int(once[:, 1:].size),
    )


def stream_windows(workers: int, world_size: int, n_streams: int, batches_per_rank: int) -> Counter:
    """{stream: micro-batches it served} when every rank drew `batches_per_rank` micro-batches (the TrainLoader's
    layout: slot g = rank x workers + worker serves streams g, g + S, ... round-robin, S = world_size x workers)."""
    slots = world_size * workers
    served: Counter = Counter()
    for rank in range(world_size):
        for w in range(workers):
            g = rank * workers + w
            mine = list(range(g, n_streams, slots))
            n = len(range(w, batches_per_rank, workers))  # this worker's share of the rank's micro-batches
            for j, s in enumerate(mine):
                served[s] += len(range(j, n, len(mine)))
    return served


def _layout(config: dict, summary: dict):
    """(DataConfig, Budget, trainer.val_tokens) of a run from its config.yaml and summary."""
    from ..budget import budget_keys, plan_budget
    from ..config import build
    from ..data import DataConfig

    data, trainer = build(DataConfig, config["data"], "data"), config["trainer"]
    budget = plan_budget(budget_keys(trainer), data.seq_len, int(summary.get("world_size") or 1))
    return data, budget, trainer.get("val_tokens")


def training_windows(data, tok, budget) -> tuple[np.ndarray, np.ndarray]:
    """(n, T+1) every training window the run consumed, all ranks, in stream order (counts do not need the order),
    and (n,) bool: whether the window starts in its source's first pass (epoch 0)."""
    from ..data.loader import resolve_sources
    from ..data.stream import Stream

    sources = resolve_sources(data)
    workers = max(1, data.num_workers)
    n_streams = data.num_streams or budget.world_size * workers
    served = stream_windows(workers, budget.world_size, n_streams, budget.steps * budget.grad_accum)
    windows, first = [], []
    for s, batches in sorted(served.items()):
        stream = Stream(sources, tok, data, s, n_streams, epochs=data.epochs)
        for _ in range(batches * budget.micro_batch_size):
            first.append(stream.next_epoch() == 0)
            windows.append(stream.next_window()[0])
    return np.stack(windows), np.array(first, dtype=bool)


def validation_windows(data, tok, max_tokens) -> np.ndarray:
    """(m, T+1) every packed window of the held-out set (at most max_tokens per source; None: all)."""
    from ..data.loader import held_out_windows

    return np.stack([w[0] for wins in held_out_windows(data, tok, max_tokens).values() for w in wins])


def cache_key(config: dict, tok_fingerprint: str, budget, val: tuple) -> str:
    data = json.loads(json.dumps(config["data"]))
    data.get("tokenizer", {}).pop("path", None)  # the run's own copy; the tokenizer counts by its fingerprint
    for k in ("worker_timeout_s", "resume", "ignore_fingerprint"):
        data.pop(k, None)
    key = {
        "version": VERSION,
        "k": BIGRAM_K,
        "data": data,
        "tokenizer": tok_fingerprint,
        "budget": dataclasses.asdict(budget),
        "val": list(val),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_baselines(run_dir: Path, cache: Path) -> Baselines:
    """The run's baselines, from `cache` when present; a run whose data cannot be read: a one-line ValueError."""
    from ..runs import Run, write_atomic

    run = Run(run_dir)
    config, summary = run.config() or {}, run.summary() or {}
    if "data" not in config or "trainer" not in config:
        raise UserError("no config.yaml with data and trainer (a run from before runs kept one)")
    if (config["data"] or {}).get("loss_on", "all") != "all":
        raise UserError(
            "data.loss_on=marked: its validation loss counts the marked targets only, the unigram/bigram "
            "baselines every target"
        )
    data, budget, val_tokens = _layout(config, summary)
    if budget.tokens > MAX_TOKENS:
        raise UserError(
            f"a budget of {budget.tokens:,} tokens is more than the baselines count "
            f"(diffllm.scaling.baselines.MAX_TOKENS = {MAX_TOKENS:,})"
        )
    tok = run.tokenizer()
    path = Path(cache) / f"{cache_key(config, tok.fingerprint, budget, (val_tokens,))}.json"
    cached = None
    if path.is_file():
        try:
            cached = Baselines(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError):
            pass  # a damaged entry is recomputed
    if cached is not None and cached.kn3 is not None:
        return cached
    if cached is not None:  # an entry from before the Kneser-Ney columns: add them where the data can be read
        try:
            windows, first = training_windows(data, tok, budget)
        except (ValueError, OSError):
            return cached
    else:
        windows, first = training_windows(data, tok, budget)
    b = cross_entropies(windows, validation_windows(data, tok, val_tokens), tok.vocab_size, first_pass=first)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(dataclasses.asdict(b)) + "\n")
    return b


def add_baselines(records: list[RunRecord], root: Path, notes: list[str]) -> None:
    """Each finished run's unigram/bigram losses (cached in <root>/.baselines) and under-trained flag (runs without a
    config.yaml: none); a run whose baselines cannot be computed is noted in `notes`, the others go on."""
    failed: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.status != "finished" or not (Path(r.run_dir) / "config.yaml").is_file():
            continue
        try:
            b = run_baselines(Path(r.run_dir), Path(root) / ".baselines")
        except ValueError as e:  # the data cannot be read here: the table goes on without this run's baselines
            failed[str(e)].append(r.run_dir)
            continue
        r.unigram_loss, r.bigram_loss, r.kn3_loss, r.kn4_loss = b.unigram, b.bigram, b.kn3, b.kn4
        if r.final_val_loss is not None:
            r.under_trained = r.final_val_loss >= b.bigram
    for why, dirs in failed.items():
        notes.append(f"baselines not computed for {len(dirs)} run(s) (first: {dirs[0]}): {why}")
