"""Reference baselines: the unigram/bigram formulas against a hand computation, the training windows against the
trainer's own loader on several ranks, and the cache in the sweep directory."""

from __future__ import annotations

import math
import shutil
from collections import Counter

import numpy as np
import pytest

from diffllm.config import build
from diffllm.data import DataConfig, build_train_loader
from diffllm.scaling.baselines import cross_entropies, stream_windows, training_windows
from diffllm.sweep.collect import collect
from diffllm.train.config import TrainerConfig, plan_budget
from tests.scaling.synthetic import data_node, hand_baselines, tokenizer, write_corpus, write_run


def test_bigram_and_unigram_equal_a_hand_computation():
    """Windows [0 1 0 1], [1 1 0 2]; vocab 3; K = 2. Targets 1 0 1 1 0 2: c = (2, 3, 1), N = 6, so
    p_uni = (3/9, 4/9, 2/9). Pairs: c(0,1) = 2, c(1,0) = 2, c(1,1) = 1, c(0,2) = 1; c(0) = 3, c(1) = 3, c(2) = 0.
    Validation [2 0 1] scores (2 -> 0) and (0 -> 1):
      p(0|2) = (0 + 2 * 3/9) / (0 + 2) = 1/3,   p(1|0) = (2 + 2 * 4/9) / (3 + 2) = 26/45."""
    b = cross_entropies(np.array([[0, 1, 0, 1], [1, 1, 0, 2]]), np.array([[2, 0, 1]]), vocab=3, k=2.0)
    assert b.unigram == -(math.log(3 / 9) + math.log(4 / 9)) / 2
    assert b.bigram == pytest.approx(-(math.log(1 / 3) + math.log(26 / 45)) / 2, rel=1e-15, abs=0)
    assert (b.train_tokens, b.val_tokens, b.vocab) == (6, 2, 3)


def test_random_corpus_matches_plain_python_counting():
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 50, (40, 9)), rng.integers(0, 50, (7, 9))
    b = cross_entropies(train, val, 50, k=3.5)
    uni, bi = hand_baselines(train.tolist(), val.tolist(), 50, 3.5)
    assert (b.unigram, b.bigram) == pytest.approx((uni, bi), rel=1e-13)


def test_layout_matches_the_train_loader_on_two_ranks(tmp_path):
    """Every window ranks 0 and 1 read (4 streams, 2 per rank, round-robin) is what training_windows rebuilds."""
    write_corpus(tmp_path)
    tok = tokenizer(tmp_path)
    data = build(DataConfig, data_node(tmp_path, 7, "unused", num_streams=4), "data")
    budget = plan_budget(
        build(TrainerConfig, {"tokens": 6 * 256, "global_batch_tokens": 256, "micro_batch_size": 4}, "trainer"),
        data.seq_len,
        2,
    )
    assert (budget.steps, budget.grad_accum) == (6, 2)
    seen = []
    for rank in (0, 1):
        loader = build_train_loader(data, tok, rank, 2, 4)
        seen += [tuple(w.tolist()) for _ in range(budget.steps * budget.grad_accum) for w in next(loader).tokens]
        loader.close()
    rebuilt = [tuple(w.tolist()) for w in training_windows(data, tok, budget)[0]]
    assert Counter(rebuilt) == Counter(seen) and len(rebuilt) == 6 * 2 * 2 * 4
    assert stream_windows(2, 1, 4, 5) == {0: 2, 2: 1, 1: 1, 3: 1}  # worker 0: batches 0, 2, 4; worker 1: 1, 3


def test_cached_in_the_sweep_dir(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    tok = tokenizer(corpus)
    write_run(tmp_path / "sweep", "transformer-micro-1", 1, 9.0, tok, corpus, 0.002)
    first = collect(tmp_path / "sweep")[0]
    assert first.under_trained is True and first.bigram_loss < 9.0
    shutil.rmtree(corpus)  # the data is gone: the numbers come from <sweep>/.baselines
    again = collect(tmp_path / "sweep")[0]
    assert (again.unigram_loss, again.bigram_loss) == (first.unigram_loss, first.bigram_loss)
    shutil.rmtree(tmp_path / "sweep" / ".baselines")
    notes: list[str] = []
    gone = collect(tmp_path / "sweep", notes=notes)[0]
    assert gone.bigram_loss is None and gone.under_trained is None
    assert (
        len(notes) == 1 and notes[0].startswith("baselines not computed for 1 run(s)") and "no files match" in notes[0]
    )
    monkeypatch.setattr("diffllm.scaling.baselines.MAX_TOKENS", 100)
    notes.clear()
    assert collect(tmp_path / "sweep", notes=notes)[0].bigram_loss is None
    assert (
        "a budget of 640 tokens is more than the baselines count (diffllm.scaling.baselines.MAX_TOKENS = 100)"
        in notes[0]
    )


def _one_epoch(stream) -> list[tuple]:
    """Every window a stream built with epochs=1 yields (the packer's own end of the first pass)."""
    out = []
    while True:
        try:
            out.append(tuple(stream.next_window()[0].tolist()))
        except StopIteration:
            return out


@pytest.mark.parametrize("num_streams", [1, 4])
def test_kneser_ney_counts_only_the_first_pass(tmp_path, num_streams):
    """A budget of about three epochs: the windows marked first-pass are, per stream, exactly what the same stream
    with epochs=1 yields, plus at most the one window that straddles the epoch boundary; every later window is not,
    and the Kneser-Ney counts read the marked ones only (the unigram/bigram every window)."""
    from diffllm.data.loader import resolve_sources
    from diffllm.data.stream import Stream

    write_corpus(tmp_path)
    tok = tokenizer(tmp_path)
    data = build(DataConfig, data_node(tmp_path, 7, "unused", num_streams=num_streams), "data")
    once = [_one_epoch(Stream(resolve_sources(data), tok, data, s, num_streams, epochs=1)) for s in range(num_streams)]
    steps = num_streams * -(-3 * max(map(len, once)) // 4)  # each stream serves every num_streams-th micro-batch of 4
    trainer = {"tokens": steps * 4 * 16, "global_batch_tokens": 4 * 16, "micro_batch_size": 4}
    budget = plan_budget(build(TrainerConfig, trainer, "trainer"), data.seq_len, 1)
    windows, first = training_windows(data, tok, budget)
    at = 0
    for s, served in sorted(stream_windows(1, 1, num_streams, budget.steps).items()):
        mine, marked = windows[at : at + 4 * served], first[at : at + 4 * served]
        at += 4 * served
        n = int(marked.sum())
        assert marked[:n].all() and not marked[n:].any() and len(mine) - n > len(once[s])  # > 2 epochs, 1 marked
        assert [tuple(w.tolist()) for w in mine[: len(once[s])]] == once[s] and n - len(once[s]) in (0, 1)
    b = cross_entropies(windows, windows[:2], tok.vocab_size, first_pass=first)
    assert b.kn_train_tokens == int(first.sum()) * 16 and b.train_tokens == len(windows) * 16
    assert b.kn3 == cross_entropies(windows[first], windows[:2], tok.vocab_size).kn3
