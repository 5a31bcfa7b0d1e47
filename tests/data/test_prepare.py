"""`data prepare` shards read back with the same semantics: identical batches and interchangeable resume state."""

from __future__ import annotations

import json

import pytest
import torch

from diffllm.data import DataError, TokenizerConfig, build_train_loader, build_val_batches
from diffllm.data.loader import resolve_sources
from diffllm.data.prepare import prepare_source
from diffllm.data.tokenizer import Tokenizer, train_bpe

from .helpers import cfg, corpus, make_docs, take, write_jsonl


def _prepare(data, tok, out, workers=1):
    srcs = resolve_sources(data) + (resolve_sources(data, val=True) if data.val else [])
    return [prepare_source(src, tok, out, workers, skip_bad=data.on_bad_record == "skip") for src in srcs]


def test_prepared_equals_raw_and_state_carries_over(tmp_path, tok):
    corpus(tmp_path / "a", n_files=3, docs_per_file=30, tag="a")
    docs = make_docs("b", 20, 1)
    docs[4], docs[9] = "", None
    write_jsonl(tmp_path / "b" / "b.jsonl", docs)
    write_jsonl(tmp_path / "v" / "v.jsonl", make_docs("v", 40, 2))
    sources = [{"name": "a", "path": str(tmp_path / "a/*.jsonl")}, {"name": "b", "path": str(tmp_path / "b/*.jsonl")}]
    val = [{"name": "v", "path": str(tmp_path / "v/v.jsonl")}]
    raw = cfg(sources, val=val)
    metas = _prepare(raw, tok, tmp_path / "prep", workers=2)
    assert [m["empty"] for m in metas] == [0, 2, 0] and metas[1]["docs"] == 18
    prepared = cfg(sources, val=val, prepared_dir=str(tmp_path / "prep"))

    ref = take(build_train_loader(raw, tok, 0, 2, 2), 12)
    assert all(torch.equal(a, b) for a, b in zip(take(build_train_loader(prepared, tok, 0, 2, 2), 12), ref))
    vr, vp = ([b.tokens for b in build_val_batches(d, tok, 2, 4)] for d in (raw, prepared))
    assert len(vr) == 4 and all(torch.equal(a, b) for a, b in zip(vr, vp))

    on_raw = [build_train_loader(raw, tok, r, 2, 2) for r in range(2)]
    for loader in on_raw:
        take(loader, 5)
    states = json.loads(json.dumps([loader.state_dict() for loader in on_raw]))
    on_prepared = build_train_loader(prepared, tok, 0, 2, 2)
    on_prepared.load_state_dict(states)  # same fingerprint: a run may switch to prepared shards mid-way
    assert all(torch.equal(a, b) for a, b in zip(take(on_prepared, 7), ref[5:]))


def test_prepared_errors(tmp_path, tok):
    corpus(tmp_path / "a", n_files=1, docs_per_file=10)
    data = cfg([{"name": "a", "path": str(tmp_path / "a/*.jsonl")}])
    missing = cfg([{"name": "a", "path": str(tmp_path / "a/*.jsonl")}], prepared_dir=str(tmp_path / "none"))
    with pytest.raises(DataError, match=r"none/a/meta.json: missing; run `diffllm data prepare` for source 'a'"):
        build_train_loader(missing, tok, 0, 1, 1)
    _prepare(data, tok, tmp_path / "prep")
    other_field = cfg(
        [{"name": "a", "path": str(tmp_path / "a/*.jsonl"), "text_field": "body"}], prepared_dir=str(tmp_path / "prep")
    )
    with pytest.raises(DataError, match="prepared from a different config of source 'a'"):
        build_train_loader(other_field, tok, 0, 1, 1)
    other = Tokenizer(train_bpe(iter(["other text " * 20]), TokenizerConfig(vocab_size=262)), "<|endoftext|>", "other")
    loader = build_train_loader(
        cfg([{"name": "a", "path": str(tmp_path / "a/*.jsonl")}], prepared_dir=str(tmp_path / "prep")), other, 0, 1, 1
    )
    with pytest.raises(DataError, match="prepared with another tokenizer"):
        next(loader)


def test_prepare_with_on_bad_record_skip_reads_back_as_the_raw_file_does(tmp_path, tok):
    """`data prepare` honours data.on_bad_record=skip: the prepared folder yields the batches and the bad-record
    count of the raw file read with skip (before: prepare refused the file, naming the skip it had been given), and a
    run with on_bad_record=error on that folder is refused in one line rather than silently missing records."""
    import numpy as np

    from diffllm.data.stream import Stream

    lines = [json.dumps({"text": t}) for t in make_docs("s", 40, 0)]
    lines.insert(5, '{"text": "cut sh')
    lines.insert(20, "not json at all")
    path = tmp_path / "raw" / "s.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    sources = [{"name": "s", "path": str(path)}]
    raw = cfg(sources, on_bad_record="skip")
    (meta,) = _prepare(raw, tok, tmp_path / "prep")
    assert (meta["docs"], meta["bad_records"]) == (40, 2)
    prepared = cfg(sources, on_bad_record="skip", prepared_dir=str(tmp_path / "prep"))
    ref = take(build_train_loader(raw, tok, 0, 1, 2), 6)
    assert all(torch.equal(a, b) for a, b in zip(take(build_train_loader(prepared, tok, 0, 1, 2), 6), ref))

    def read_all(data) -> tuple[list, int]:
        stream = Stream(resolve_sources(data), tok, data, 0, 1, epochs=1)
        windows = []
        with pytest.raises(StopIteration):
            while True:
                windows.append(stream.next_window()[0])
        toks = np.concatenate(windows + [p.tail() for p in stream.packers])
        return toks.tolist(), stream.state()["sources"]["s"]["bad_records"]

    assert read_all(prepared) == read_all(raw) and read_all(raw)[1] == 2
    strict = cfg(sources, prepared_dir=str(tmp_path / "prep"))
    with pytest.raises(DataError, match=r"prep/s: prepared with data.on_bad_record=skip \(2 malformed records"):
        take(build_train_loader(strict, tok, 0, 1, 2), 1)
