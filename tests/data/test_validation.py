"""Validation data: a held-out share of the training documents (data.val_fraction) that training never reads, and
validation batches per held-out source (build_val_sets) beside the mixed ones (build_val_batches)."""

from __future__ import annotations

import numpy as np
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
    for name, docs in (("va", a_docs), ("vb", b_docs)):
        # its own documents only (spread over the source now, not its first ones: see the test below)
        pieces = [p for b in sets[name] for w in b for p in tok.decode(w.tolist()).split("<|endoftext|>") if p]
        assert all(p in "\0".join(docs) for p in pieces), name  # (a0 and b0 share words: the ids tell them apart)
        alone = [
            b.tokens for b in build_val_batches(cfg([train], val=[v for v in val if v["name"] == name]), tok, 2, 4)
        ]
        assert all((x == y).all() for x, y in zip(sets[name], alone))  # the same as a config with that source alone
    mixed = [b.tokens for b in build_val_batches(data, tok, 2, 4)]  # the main set takes windows of both sources
    text = "".join(tok.decode(b.flatten().tolist()) for b in mixed)
    assert "a0-" in text and "b1-" in text


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


def test_validation_windows_spread_over_every_source_and_position(tmp_path, tok):
    """The windows validated, located in an independently built token stream of each held-out source (its documents
    in file order, tokenized one by one, each followed by EOS): every source gives windows in proportion to its size,
    from its first to its last share, evenly strided; a per-source set spreads over its own source alike."""
    a_docs = corpus(tmp_path / "a", n_files=1, docs_per_file=60, tag="a")
    b_docs = corpus(tmp_path / "b", n_files=2, docs_per_file=90, tag="b", seed=1)
    val = [{"name": "va", "path": str(tmp_path / "a/*.jsonl")}, {"name": "vb", "path": str(tmp_path / "b/*.jsonl")}]
    data = cfg([{"path": str(tmp_path / "a/*.jsonl")}], val=val)
    window = data.seq_len + 1
    streams = {
        name: np.concatenate([np.asarray(tok.encode(d) + [tok.eos_id]) for d in docs])
        for name, docs in (("va", a_docs), ("vb", b_docs))
    }

    def offsets(batches) -> dict[str, list[int]]:  # where each validated window starts in its source's stream
        found: dict[str, list[int]] = {"va": [], "vb": []}
        for w in (w.numpy() for b in batches for w in b.tokens):
            hits = [
                (name, i)
                for name, s in streams.items()
                for i in range(0, len(s) - window + 1, window)  # the packer's windows do not overlap
                if (s[i : i + window] == w).all()
            ]
            assert len(hits) == 1, hits
            found[hits[0][0]].append(hits[0][1])
        return found

    n = {name: len(s) // window for name, s in streams.items()}  # each source's full windows
    got = offsets(build_val_batches(data, tok, 4, 5))  # 20 windows over both sources
    assert sum(map(len, got.values())) == 20
    for name, offs in got.items():
        k = len(offs)
        assert abs(k - 20 * n[name] / sum(n.values())) <= 1, (name, k)  # its share, proportional to its size
        gaps = np.diff(offs) / window
        assert offs[0] / window < n[name] / k and (n[name] - 1 - offs[-1] / window) < n[name] / k  # first to last
        assert gaps.min() >= int(n[name] / k) and gaps.max() <= int(n[name] / k) + 1  # evenly strided
    own = offsets(build_val_sets(data, tok, 2, 3)["vb"])["vb"]
    assert len(own) == 6 and own[0] / window < n["vb"] / 6 and own[-1] / window > n["vb"] * 5 / 6
    assert offsets(build_val_batches(data, tok, 4, 5)) == got  # the same windows every time
    capped = offsets(build_val_batches(data, tok, 4, 1, max_tokens=10 * data.seq_len))  # 10 windows per source
    assert all(max(offs) < 10 * window for offs in capped.values())
