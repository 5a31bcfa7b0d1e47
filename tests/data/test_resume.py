"""Exact resume: consume k batches, save, restore into fresh loaders, and the next batches equal an uninterrupted
run token for token (single source, mixture, across an epoch boundary, 2 ranks x 2 DataLoader workers)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from diffllm.data import DataError, build_train_loader

from .helpers import cfg, corpus, make_docs, take, write_jsonl


def _roundtrip(states: list[dict]) -> list[dict]:
    return json.loads(json.dumps(states))  # the state must survive JSON as-is


def _rows(loader, n: int) -> list[torch.Tensor]:
    """n batches as (B, 3, T+1): tokens, document ids and loss marks, all compared."""
    return [torch.stack([b.tokens, b.doc_ids, b.loss_mask.long()], dim=1) for b in (next(loader) for _ in range(n))]


def check_resume(data, tok, world_size: int, k: int, m: int, micro: int = 2) -> list[dict]:
    """Uninterrupted k+m batches per rank vs k batches, save, fresh loaders, m batches, with the windows' document ids
    and loss marks on (they must resume too). Returns the saved states."""
    data = dataclasses.replace(data, doc_mask=True, loss_on="marked")
    ref = [_rows(build_train_loader(data, tok, r, world_size, micro), k + m) for r in range(world_size)]
    first = [build_train_loader(data, tok, r, world_size, micro) for r in range(world_size)]
    for loader in first:
        take(loader, k)
    states = _roundtrip([loader.state_dict() for loader in first])
    for r in range(world_size):
        resumed = build_train_loader(data, tok, r, world_size, micro)
        resumed.load_state_dict(states)
        got = _rows(resumed, m)
        for i, (a, b) in enumerate(zip(got, ref[r][k:])):
            assert torch.equal(a, b), f"rank {r}: batch {k + i} differs after resume"
    return states


@pytest.mark.parametrize("k", [1, 5, 13])
def test_single_source(tmp_path, tok, k):
    corpus(tmp_path, n_files=3, docs_per_file=40)
    check_resume(cfg([{"path": str(tmp_path / "*.jsonl")}]), tok, 1, k, 8)


def test_mixture(tmp_path, tok):
    corpus(tmp_path / "a", n_files=2, docs_per_file=40, tag="a")
    corpus(tmp_path / "b", n_files=3, docs_per_file=40, tag="b")
    data = cfg(
        [
            {"name": "a", "path": str(tmp_path / "a/*.jsonl"), "weight": 0.7},
            {"name": "b", "path": str(tmp_path / "b/*.jsonl"), "weight": 0.3},
        ]
    )
    states = check_resume(data, tok, 1, 9, 10)
    windows = states[0]["streams"]["0"]["windows"]
    assert windows == 18
    used = {n: s["tokens"] for n, s in states[0]["consumed"].items()}
    assert used["a"] > used["b"] > 0  # both sources drawn, a more often


def test_mixture_is_seeded(tmp_path, tok):
    corpus(tmp_path / "a", n_files=1, docs_per_file=30, tag="a")
    corpus(tmp_path / "b", n_files=1, docs_per_file=30, tag="b")
    srcs = [{"name": "a", "path": str(tmp_path / "a/*.jsonl")}, {"name": "b", "path": str(tmp_path / "b/*.jsonl")}]
    run = lambda seed: torch.cat(take(build_train_loader(cfg(srcs, seed=seed), tok, 0, 1, 4), 6))  # noqa: E731
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_across_epoch_boundary(tmp_path, tok):
    docs = corpus(tmp_path, n_files=3, docs_per_file=4)  # a small corpus: one epoch is a few batches
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], seq_len=15)
    per_epoch = sum(len(tok.encode(d)) + 1 for d in docs) // 16 // 2  # micro-batches of 2 windows of 16 tokens
    assert per_epoch >= 4
    before = check_resume(data, tok, 1, per_epoch - 1, 2 * per_epoch + 3)  # saved in epoch 0, resumed across 2 more
    assert before[0]["consumed"]["all"]["epoch"] == 0
    after = check_resume(data, tok, 1, per_epoch + 2, per_epoch)  # saved in epoch 1 (file order reshuffled)
    assert after[0]["consumed"]["all"]["epoch"] == 1


def test_two_ranks_two_workers(tmp_path, tok):
    corpus(tmp_path, n_files=5, docs_per_file=30)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], num_workers=2)
    states = check_resume(data, tok, 2, 7, 9)  # odd k: the next batch comes from each rank's second worker
    assert [s["next_worker"] for s in states] == [1, 1]
    assert sorted(int(s) for st in states for s in st["streams"]) == [0, 1, 2, 3]


def test_other_world_size_continues_every_stream(tmp_path, tok):
    """4 streams saved by 2 ranks resume on 1 rank: the resumed batches are each stream's next windows."""
    corpus(tmp_path, n_files=5, docs_per_file=30)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], num_streams=4)
    saved = [build_train_loader(data, tok, r, 2, 1) for r in range(2)]
    for loader, k in zip(saved, (5, 8)):
        take(loader, k)
    states = _roundtrip([loader.state_dict() for loader in saved])
    one = build_train_loader(data, tok, 0, 1, 1)
    one.load_state_dict(states)
    got = take(one, 12)  # round-robin over streams 0, 1, 2, 3
    reference = {s: take(_single_stream(data, tok, s), 20) for s in range(4)}
    used = {s: states[s % 2]["streams"][str(s)]["windows"] for s in range(4)}
    for i, batch in enumerate(got):
        s = i % 4
        assert torch.equal(batch, reference[s][used[s] + i // 4]), f"stream {s} did not continue exactly"


def _single_stream(data, tok, s):
    """A loader that reads only stream s of 4 (rank s of world size 4)."""
    return build_train_loader(data, tok, s, 4, 1)


def test_world_size_that_does_not_divide_is_refused(tmp_path, tok):
    corpus(tmp_path, n_files=5, docs_per_file=10)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}])
    states = [build_train_loader(data, tok, r, 2, 1).state_dict() for r in range(2)]
    three = build_train_loader(data, tok, 0, 3, 1)
    with pytest.raises(DataError, match=r"world_size x data.num_workers = 3 x 1 = 3 must divide 2 .*data.resume=false"):
        three.load_state_dict(states)
    with pytest.raises(DataError, match="pass the states of all 2 ranks"):
        build_train_loader(data, tok, 0, 2, 1).load_state_dict(states[:1])


def test_changed_sources_are_refused_unless_ignored(tmp_path, tok):
    corpus(tmp_path, n_files=2, docs_per_file=10)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}])
    loader = build_train_loader(data, tok, 0, 1, 1)
    take(loader, 3)
    state = loader.state_dict()
    with open(tmp_path / "part-01.jsonl", "a") as f:
        f.write('{"text": "one more document"}\n')
    name = loader.sources[0].name
    changed = rf"source '{name}' changed \(same files, new contents.*part-00\.jsonl, .*part-01\.jsonl\) since it"
    with pytest.raises(DataError, match=rf"fingerprint .* {changed} was saved.*ignore_fingerprint=true"):
        build_train_loader(data, tok, 0, 1, 1).load_state_dict([state])
    (tmp_path / "part-02.jsonl").write_text('{"text": "a new file"}\n')
    with pytest.raises(DataError, match=rf"source '{name}' changed \(added .*part-02\.jsonl\) since"):
        build_train_loader(data, tok, 0, 1, 1).load_state_dict([state])
    (tmp_path / "part-02.jsonl").unlink()
    old = {k: v for k, v in state.items() if k not in ("source_fingerprints", "tokenizer_fingerprint")}
    with pytest.raises(DataError, match="the sources or the tokenizer changed since it was saved"):  # an older state
        build_train_loader(data, tok, 0, 1, 1).load_state_dict([old])
    ignoring = build_train_loader(cfg([{"path": str(tmp_path / "*.jsonl")}], ignore_fingerprint=True), tok, 0, 1, 1)
    ignoring.load_state_dict([state])
    assert next(ignoring).tokens.shape == (1, 32)


def _stream_windows_and_states(data, tok, state=None, n=None):
    from diffllm.data.loader import resolve_sources
    from diffllm.data.stream import Stream

    s = Stream(resolve_sources(data), tok, data, 0, 1, state=state, epochs=2)
    out = []
    while n is None or len(out) < n:
        try:
            out.append((s.next_window(), json.loads(json.dumps(s.state()))))
        except StopIteration:
            break
    return out


@pytest.mark.parametrize("exact_boundaries", [True, False])
def test_resume_after_every_window(tmp_path, tok, exact_boundaries):
    """Restore from the state after each window k (incl. windows ending exactly at a document's EOS, and empty
    documents): window k+1 and the counters after it match the uninterrupted stream."""
    candidates = make_docs("x", 600, seed=5, max_words=4)
    lengths = [len(tok.encode(d)) + 1 for d in candidates]
    common = max(set(lengths), key=lengths.count)
    docs = [d for d, n in zip(candidates, lengths) if n == common][:24] if exact_boundaries else candidates[:40]
    docs[3:3] = ["", None]
    write_jsonl(tmp_path / "a.jsonl", docs[: len(docs) // 2])
    write_jsonl(tmp_path / "b.jsonl", docs[len(docs) // 2 :])
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], seq_len=2 * common - 1 if exact_boundaries else 13)
    ref = _stream_windows_and_states(data, tok)
    assert len(ref) > 10
    for k in range(len(ref) - 1):
        ((window, state),) = _stream_windows_and_states(data, tok, ref[k][1], 1)
        assert np.array_equal(window, ref[k + 1][0]) and state == ref[k + 1][1], f"resume after window {k}"


def test_workers_survive_a_stop_signal(tmp_path, tok):
    """SIGTERM to the whole process group (Slurm, Ctrl-C) must leave the workers to the trainer, which saves first."""
    import signal

    corpus(tmp_path, n_files=2, docs_per_file=30)
    loader = build_train_loader(cfg([{"path": str(tmp_path / "*.jsonl")}], num_workers=2), tok, 0, 1, 1)
    first = take(loader, 3)
    for pid in [w.pid for w in loader._it._workers]:
        os.kill(pid, signal.SIGTERM)
    more = take(loader, 3)
    assert len(first + more) == 6 and all(w.is_alive() for w in loader._it._workers)
