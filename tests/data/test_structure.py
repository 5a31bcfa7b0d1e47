"""Packed windows carry their structure: document ids (the row restarts at 0 and steps at each document start), loss
marks (a synthetic source marks its answers only), and the Batch the data config asks for; exact resume, sharding
and prepared shards keep them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffllm.data import DataError, build_train_loader
from diffllm.data.batch import DOCS, MARKS, TOKENS, Batch
from diffllm.data.loader import resolve_sources
from diffllm.data.needle import VALUES, NeedleSpec, needle_document
from diffllm.data.prepare import prepare_source
from diffllm.data.stream import Stream

from .helpers import cfg, corpus

NEEDLE = {"name": "needles", "format": "needle", "path": "needle:n_needles=1-3,queries=4,filler=6,docs=500"}


def windows(data, tok, n: int, stream: int = 0, n_streams: int = 1) -> list[np.ndarray]:
    s = Stream(resolve_sources(data), tok, data, stream, n_streams)
    return [s.next_window() for _ in range(n)]


def test_document_ids_step_after_each_eos(tmp_path, tok):
    """The ids row, against an independent rule on the tokens: +1 after every EOS (the text holds no EOS)."""
    corpus(tmp_path, n_files=2, docs_per_file=30)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], seq_len=47)
    got = windows(data, tok, 40)
    starts = 0
    for w in got:
        assert w.shape == (3, 48) and w.dtype == np.int32
        after_eos = np.concatenate([[0], (w[TOKENS, :-1] == tok.eos_id).astype(np.int32)])
        np.testing.assert_array_equal(w[DOCS], np.cumsum(after_eos))
        assert (w[MARKS] == 1).all()  # an unmarked source: every token counts
        starts += int(w[DOCS, -1] > 0)
    assert starts > 10  # many windows hold a document boundary: the rule was exercised


def test_needle_documents_mark_the_answers_only(tok):
    """Marked segments tokenize as the whole text does, and the marked tokens are the queries' values."""
    spec = NeedleSpec.parse(NEEDLE["path"])
    for j in range(20):
        doc = needle_document(np.random.default_rng([0, 0, j]), spec)
        parts = [tok.encode(text) for text, _ in doc.parts]
        assert sum(parts, []) == tok.encode(str(doc)), j
        answers = [text for text, counts in doc.parts if counts]
        assert len(answers) == spec.queries and all(a.strip().isalpha() for a in answers)
    data = cfg([NEEDLE], seq_len=63, loss_on="marked")
    stream = np.concatenate(windows(data, tok, 10), axis=1)  # consecutive windows: a value cut by a window boundary
    marked = stream[TOKENS][stream[MARKS] == 1].tolist()  # is whole again
    words = tok.decode(marked).split()
    assert tok.eos_id not in marked and len(words) >= 10 and set(words[1:-1]) <= set(VALUES)


def test_the_batch_holds_what_the_config_asks_for(tmp_path, tok):
    corpus(tmp_path, n_files=1, docs_per_file=40)
    src = [{"path": str(tmp_path / "*.jsonl")}, NEEDLE]
    plain = next(build_train_loader(cfg(src), tok, 0, 1, 2))
    assert plain.doc_ids is None and plain.loss_mask is None and plain.model_kwargs() == {}
    assert plain.loss_tokens() == plain.targets.numel() == 2 * 31
    full = next(build_train_loader(cfg(src, doc_mask=True, restart_positions=True, loss_on="marked"), tok, 0, 1, 2))
    assert torch.equal(full.tokens, plain.tokens)
    kw = full.model_kwargs()
    assert kw["restart_positions"] is True and torch.equal(kw["doc_ids"], full.doc_ids[:, :-1])
    assert full.loss_tokens() == int(full.loss_mask[:, 1:].sum())


def test_bad_settings_are_one_line_errors():
    with pytest.raises(DataError, match=r"data.restart_positions=true needs data.doc_mask=true"):
        cfg([NEEDLE], restart_positions=True)
    with pytest.raises(DataError, match=r"data.loss_on: got 'answers', expected one of \('all', 'marked'\)"):
        cfg([NEEDLE], loss_on="answers")


def _same(a: Batch, b: Batch) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.tokens, b.tokens), (a.doc_ids, b.doc_ids), (a.loss_mask, b.loss_mask)))


def test_resume_and_sharding_keep_the_structure(tmp_path, tok):
    """2 ranks, a text + needle mixture, doc ids and loss marks on: k batches, save, restore, the next m equal an
    uninterrupted run's in tokens, ids and marks; the two ranks' windows differ."""
    corpus(tmp_path, n_files=3, docs_per_file=40)
    data = cfg([{"path": str(tmp_path / "*.jsonl"), "weight": 0.5}, NEEDLE], doc_mask=True, loss_on="marked")
    k, m = 5, 6
    ref = [
        [next(loader) for _ in range(k + m)] for loader in (build_train_loader(data, tok, r, 2, 2) for r in range(2))
    ]
    first = [build_train_loader(data, tok, r, 2, 2) for r in range(2)]
    for loader in first:
        [next(loader) for _ in range(k)]
    states = json.loads(json.dumps([loader.state_dict() for loader in first]))
    for r in range(2):
        resumed = build_train_loader(data, tok, r, 2, 2)
        resumed.load_state_dict(states)
        assert all(_same(next(resumed), b) for b in ref[r][k:]), r
    assert not torch.equal(ref[0][0].tokens, ref[1][0].tokens)
    assert any(bool((~b.loss_mask).any()) and bool(b.loss_mask.any()) for b in ref[0])  # needle windows mixed in


def test_prepared_runs_generate_synthetic_sources_on_the_fly(tmp_path, tok):
    """`data prepare` leaves a needle source out (nothing to prepare); a prepared run reads the same batches, marks
    included."""
    corpus(tmp_path / "a", n_files=2, docs_per_file=30)
    sources = [{"name": "a", "path": str(tmp_path / "a/*.jsonl")}, NEEDLE]
    raw = cfg(sources, loss_on="marked", doc_mask=True)
    prepare_source(resolve_sources(raw)[0], tok, tmp_path / "prep")
    prepared = cfg(sources, loss_on="marked", doc_mask=True, prepared_dir=str(tmp_path / "prep"))
    a, b = build_train_loader(raw, tok, 0, 1, 2), build_train_loader(prepared, tok, 0, 1, 2)
    assert [s.kind for s in resolve_sources(prepared)] == ["prepared", "needle"]
    assert all(_same(next(a), next(b)) for _ in range(8))
