"""Packing: full windows, EOS after every document, nothing lost or reordered between windows; empty documents
and undecodable bytes are counted."""

from __future__ import annotations

import numpy as np

from diffllm.data import build_train_loader

from .helpers import cfg, drain, make_docs, write_jsonl


def test_windows_are_full_eos_separated_and_lossless(tmp_path, tok):
    docs = make_docs("p", 40, seed=1)
    docs[7] = " ".join(["a long document"] * 60)  # spans several windows
    write_jsonl(tmp_path / "one.jsonl", docs)
    data = cfg([{"path": str(tmp_path / "one.jsonl")}], seq_len=15, shuffle_files=False)
    got = drain(data, tok, 0, 1)
    # independent reference: each document encoded on its own, EOS appended, concatenated in file order
    ref = np.concatenate([tok.encode(d) + [tok.eos_id] for d in docs])
    assert len(tok.encode(docs[7])) > 3 * 16
    np.testing.assert_array_equal(got, ref)


def test_loader_batches_have_the_interface_shape(tmp_path, tok):
    write_jsonl(tmp_path / "one.jsonl", make_docs("p", 30, seed=2))
    loader = build_train_loader(cfg([{"path": str(tmp_path / "*.jsonl")}]), tok, 0, 1, 3)
    for _ in range(4):
        batch = next(loader).tokens
        assert batch.shape == (3, 32) and str(batch.dtype) == "torch.int64"


def test_empty_docs_and_undecodable_bytes_are_counted(tmp_path, tok):
    docs = make_docs("e", 12, seed=3)
    docs[2], docs[5], docs[9] = "", None, ""
    write_jsonl(tmp_path / "a.jsonl", docs[:1])
    with open(tmp_path / "a.jsonl", "ab") as f:
        f.write(b'{"text": "broken \xff\xfe bytes here"}\n')
    write_jsonl(tmp_path / "b.jsonl", docs[1:])
    (tmp_path / "a.jsonl").write_bytes((tmp_path / "a.jsonl").read_bytes() + (tmp_path / "b.jsonl").read_bytes())
    (tmp_path / "b.jsonl").unlink()
    loader = build_train_loader(cfg([{"path": str(tmp_path / "a.jsonl")}], seq_len=7, epochs=1), tok, 0, 1, 1)
    windows = [b.tokens for b in loader]
    counts = loader.consumed()["a"]
    assert counts["empty"] == 3
    assert counts["undecodable"] == 2  # two invalid bytes, each replaced by U+FFFD
    body = np.concatenate([w[0].numpy() for w in windows])
    assert "broken \ufffd\ufffd bytes here" in tok.decode(body.tolist())
    assert counts["docs"] == (body == tok.eos_id).sum()  # an empty document adds no EOS


def test_empty_and_undecodable_are_reported_once(tmp_path, tok, capfd):
    write_jsonl(tmp_path / "r.jsonl", ["one", "", "two", "", "three \ufffd"] * 3)
    list(build_train_loader(cfg([{"path": str(tmp_path / "r.jsonl")}], seq_len=3, epochs=1), tok, 0, 1, 1))
    err = capfd.readouterr().err.splitlines()
    assert err == [
        "[diffllm.data] source 'r': empty documents are skipped (no tokens, no EOS) and counted (first: "
        f"{tmp_path / 'r.jsonl'} example 1)",
        "[diffllm.data] source 'r': undecodable bytes are replaced by U+FFFD and counted (first: "
        f"{tmp_path / 'r.jsonl'} example 4)",
    ]
