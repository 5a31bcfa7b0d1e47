"""Validation data: a held-out share of the training documents (data.val_fraction) that training never reads, and
validation batches per held-out source (build_val_sets) beside the mixed ones (build_val_batches)."""

from __future__ import annotations

import pytest

from diffllm.data import DataError, build_train_loader, build_val_batches, build_val_sets

from .helpers import cfg, corpus, drain, split_docs, take


def test_val_fraction_holds_out_documents_that_training_never_reads(tmp_path, tok):
    docs = corpus(tmp_path, n_files=3, docs_per_file=60)
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], val_fraction=0.2)
    train = split_docs(drain(data, tok, 0, 1), tok)
    val = split_docs(drain(data, tok, 0, 1, part="val"), tok)
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(docs)  # nothing lost, nothing read twice
    assert 0.1 < len(val) / len(docs) < 0.3
    # the split does not depend on the seed, the stream layout or the world size
    other = cfg([{"path": str(tmp_path / "*.jsonl")}], val_fraction=0.2, seed=99)
    assert sorted(split_docs(drain(other, tok, 0, 1, part="val"), tok)) == sorted(val)
    on_two = [d for s in range(2) for d in split_docs(drain(other, tok, s, 2), tok)]
    assert sorted(on_two) == sorted(train)
    # validation batches come from the held-out documents only
    batches = [b.tokens for b in build_val_batches(data, tok, 2, 3)]
    assert len(batches) == 3 and batches[0].shape == (2, 32)
    text = tok.decode(batches[0][0].tolist())
    assert any(d[:12] in text for d in val) and not any(d in text for d in train if len(d) > 12)


def test_val_fraction_changes_the_fingerprint_and_is_checked(tmp_path, tok):
    corpus(tmp_path, n_files=2, docs_per_file=20)
    plain = build_train_loader(cfg([{"path": str(tmp_path / "*.jsonl")}]), tok, 0, 1, 1)
    take(plain, 2)
    split = build_train_loader(cfg([{"path": str(tmp_path / "*.jsonl")}], val_fraction=0.1), tok, 0, 1, 1)
    with pytest.raises(DataError, match="fingerprint"):  # the training stream is another one now
        split.load_state_dict([plain.state_dict()])
    with pytest.raises(DataError, match=r"data.val_fraction: must be in \[0, 1\), got 1.5"):
        cfg([{"path": "a.jsonl"}], val_fraction=1.5)
    with pytest.raises(DataError, match=r"only when data.val is empty; set data.val=\[\]"):
        cfg([{"path": "a.jsonl"}], val=[{"path": "b.jsonl"}], val_fraction=0.1)
    with pytest.raises(
        DataError, match=r"data.val: empty; configure at least one held-out source, or set data.val_fraction"
    ):
        build_val_batches(cfg([{"path": str(tmp_path / "*.jsonl")}]), tok, 1, 1)


def test_val_sets_per_source(tmp_path, tok):
    a_docs = corpus(tmp_path / "a", n_files=1, docs_per_file=40, tag="a")
    b_docs = corpus(tmp_path / "b", n_files=2, docs_per_file=40, tag="b")
    train = {"path": str(tmp_path / "a/*.jsonl")}
    val = [
        {"name": "va", "path": str(tmp_path / "a/*.jsonl")},
        {"name": "vb", "path": str(tmp_path / "b/*.jsonl"), "weight": 3},
    ]
    data = cfg([train], val=val)
    sets = {k: [b.tokens for b in v] for k, v in build_val_sets(data, tok, 2, 4).items()}
    assert list(sets) == ["va", "vb"] and all(len(v) == 4 and v[0].shape == (2, 32) for v in sets.values())
    for name, docs, other in (("va", a_docs, b_docs), ("vb", b_docs, a_docs)):
        text = "".join(tok.decode(b.flatten().tolist()) for b in sets[name])
        assert docs[0] in text and not any(d.split()[0] + " " in text for d in other), name
        alone = [
            b.tokens for b in build_val_batches(cfg([train], val=[v for v in val if v["name"] == name]), tok, 2, 4)
        ]
        assert all((x == y).all() for x, y in zip(sets[name], alone))  # the same as a config with that source alone
    mixed = [b.tokens for b in build_val_batches(data, tok, 2, 4)]  # the old function still mixes the sources by weight
    text = "".join(tok.decode(b.flatten().tolist()) for b in mixed)
    assert "a0-" in text and "b0-" in text


def test_val_sets_with_val_fraction_and_too_little_data(tmp_path, tok):
    corpus(tmp_path / "a", n_files=1, docs_per_file=100, tag="a")
    corpus(tmp_path / "b", n_files=1, docs_per_file=100, tag="b")
    sources = [{"name": "a", "path": str(tmp_path / "a/*.jsonl")}, {"name": "b", "path": str(tmp_path / "b/*.jsonl")}]
    data = cfg(sources, val_fraction=0.1)
    sets = {k: [b.tokens for b in v] for k, v in build_val_sets(data, tok, 2, 2).items()}
    assert list(sets) == ["a", "b"]
    held_out_b = split_docs(drain(cfg(sources[1:], val_fraction=0.1), tok, 0, 1, part="val"), tok)
    assert tok.decode(sets["b"][0][0].tolist()) in "<|endoftext|>".join(held_out_b + [""])
    with pytest.raises(
        DataError,
        match=r"held-out source 'a': only \d+ windows .* fewer than one batch of 1000; raise data.val_fraction",
    ):
        build_val_sets(data, tok, 1000, 1)
