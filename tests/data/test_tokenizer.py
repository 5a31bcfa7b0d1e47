"""Tokenizers: the trained byte-level BPE is lossless, loads from tokenizer.json or a HF folder, is cached once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from diffllm.data import DataError, Tokenizer, ensure_tokenizer, load_tokenizer
from diffllm.data.tokenizer import train_bpe

from .conftest import PLAYS
from .helpers import cfg, corpus

TEXT = "To be, or not to be: that is the question.\n\tNaïve café — 日本語 🎭  double  spaces\r\n"


def test_bpe_is_lossless_and_eos_is_special(tok):
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.eos_id not in ids
    assert tok.eos_id not in tok.encode("a literal <|endoftext|> in a document stays text")
    assert tok.vocab_size == 320 and max(ids) < tok.vocab_size
    assert len(tok.encode("the king")) < len("the king")  # merges were learned


def test_tokenizer_json_and_hf_folder_load_the_same(tmp_path, tok):
    tok.save(tmp_path / "tokenizer.json")
    from_file = load_tokenizer(str(tmp_path / "tokenizer.json"), "<|endoftext|>")
    assert from_file.encode(TEXT) == tok.encode(TEXT) and from_file.fingerprint == tok.fingerprint
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "hf"
    PreTrainedTokenizerFast(tokenizer_object=tok.tk, eos_token="<|endoftext|>").save_pretrained(folder)
    from_folder = load_tokenizer(str(folder), "ignored-because-the-folder-says")
    assert from_folder.encode(TEXT) == tok.encode(TEXT) and from_folder.eos_id == tok.eos_id


def test_folder_eos_must_exist(tmp_path, tok):
    tok.save(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(DataError, match=r"eos token '</s>' is not in the vocabulary; set data.tokenizer.eos_token"):
        load_tokenizer(str(tmp_path), "<|endoftext|>")
    with pytest.raises(DataError, match="nowhere: no such file or folder"):
        load_tokenizer(str(tmp_path / "nowhere"), "<|endoftext|>")


def test_default_tokenizer_is_trained_once_and_cached(tmp_path, capfd):
    corpus(tmp_path / "c", n_files=2, docs_per_file=50)
    data = cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 300})
    first = ensure_tokenizer(data)
    said = capfd.readouterr().err
    assert "training a byte-level BPE (vocab 300)" in said and str(tmp_path / "cache" / "tokenizers") in said
    assert first.vocab_size == 300
    again = ensure_tokenizer(data)
    assert capfd.readouterr().err == "" and again.fingerprint == first.fingerprint
    other = ensure_tokenizer(cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 280}))
    assert other.vocab_size == 280  # another setting is another cache entry


def test_configured_path_is_used(tmp_path, tok):
    tok.save(tmp_path / "t.json")
    data = cfg([{"path": str(PLAYS / "hamlet_gut.txt")}], tokenizer={"path": str(tmp_path / "t.json")})
    assert isinstance(ensure_tokenizer(data), Tokenizer) and ensure_tokenizer(data).fingerprint == tok.fingerprint


def test_train_bpe_respects_special_tokens():
    from diffllm.data import TokenizerConfig

    tk = train_bpe(
        iter(["some text " * 50]), TokenizerConfig(vocab_size=270, special_tokens=["<pad>", "<|endoftext|>"])
    )
    assert tk.token_to_id("<|endoftext|>") == 0 and tk.token_to_id("<pad>") == 1


def test_a_vocabulary_smaller_than_asked_is_explained(tmp_path, capfd):
    """A tiny corpus runs out of pairs occurring min_frequency times long before 8192 tokens: say so, and why."""
    corpus(tmp_path / "c", n_files=1, docs_per_file=20)
    tok = ensure_tokenizer(cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 8192}))
    err = capfd.readouterr().err
    assert tok.vocab_size < 8192
    assert (
        f"warning: the trained tokenizer has {tok.vocab_size} tokens, fewer than data.tokenizer.vocab_size=8192: its "
    ) in err and "min_frequency=2 times (the corpus is too small" in err
    assert f"set data.tokenizer.vocab_size={tok.vocab_size}" in err
    ensure_tokenizer(cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 300}))
    assert "warning" not in capfd.readouterr().err  # a vocabulary that fills up says nothing


def test_train_on_limits_the_bpe_to_the_named_sources(tmp_path):
    """A synthetic source mixed into the data does not shape the vocabulary when train_on names the text source: the
    tokenizer equals the one trained on the text source alone (the same cache entry), and differs from the mixture's."""
    corpus(tmp_path / "c", n_files=2, docs_per_file=50)
    text = {"name": "text", "path": str(tmp_path / "c/*.jsonl")}
    needles = {"name": "needles", "format": "needle", "path": "needle:filler=400,docs=2000", "weight": 0.1}
    alone = ensure_tokenizer(cfg([text], tokenizer={"vocab_size": 300}))
    limited = ensure_tokenizer(cfg([text, needles], tokenizer={"vocab_size": 300, "train_on": ["text"]}))
    mixed = ensure_tokenizer(cfg([text, needles], tokenizer={"vocab_size": 300}))
    assert limited.fingerprint == alone.fingerprint != mixed.fingerprint
    with pytest.raises(
        DataError, match=r"^data.tokenizer.train_on: no training source named 'txt'; did you mean 'text'\?$"
    ):
        ensure_tokenizer(cfg([text, needles], tokenizer={"vocab_size": 300, "train_on": ["txt"]}))


CUT_SHORT = '{"version": "1.0", "truncation": null, "added_tokens": [{"id": 0, "cont'


def test_a_corrupt_tokenizer_json_is_one_line_naming_the_file(tmp_path):
    """`diffllm train data.tokenizer.path=...` with a tokenizer.json cut short: exit 2, one line naming the file
    (it was 60 lines of traceback prefixed [rank0]:)."""
    (tmp_path / "tokenizer.json").write_text(CUT_SHORT)
    res = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "train", f"data.tokenizer.path={tmp_path / 'tokenizer.json'}"]
        + [f"run_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        env={**os.environ, "DIFFLLM_CACHE": str(tmp_path / "cache")},
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [
        f"diffllm train: error: {tmp_path / 'tokenizer.json'}: not a readable tokenizer.json "
        "(EOF while parsing a string at line 1 column 71)"
    ], res.stderr[-3000:]


def test_a_corrupt_file_in_a_tokenizer_folder_is_named(tmp_path, tok):
    tok.save(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": ')
    with pytest.raises(DataError, match=r"tokenizer_config.json: not a JSON object \(Expecting value"):
        load_tokenizer(str(tmp_path), "<|endoftext|>")
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer.json").write_text(CUT_SHORT)
    with pytest.raises(DataError, match=r"tokenizer.json: not a readable tokenizer.json \(EOF while parsing"):
        load_tokenizer(str(tmp_path), "<|endoftext|>")


def test_a_vocab_size_below_the_byte_alphabet_is_said(tmp_path, capfd):
    """data.tokenizer.vocab_size=100 cannot hold the 256 byte tokens and EOS: the BPE has 257, said in one line."""
    corpus(tmp_path / "c", n_files=1, docs_per_file=20)
    tok = ensure_tokenizer(cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 100}))
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert tok.vocab_size == 257 and warnings == [
        "[diffllm.data] warning: data.tokenizer.vocab_size=100 is below the smallest byte-level BPE (256 byte tokens "
        "+ 1 special): the tokenizer has 257 tokens; set data.tokenizer.vocab_size=257 or more to make it explicit"
    ]


def test_a_failed_tokenizer_training_leaves_no_cache_folder(tmp_path, monkeypatch):
    """Training stops at a malformed line: the error names it, and no cache folder holding only `.lock` stays."""
    monkeypatch.setenv("DIFFLLM_CACHE", str(tmp_path / "cache"))
    corpus(tmp_path / "c", n_files=1, docs_per_file=20)
    with open(tmp_path / "c" / "part-00.jsonl", "a") as f:
        f.write('{"text": "cut short\n')
    with pytest.raises(DataError, match=r"part-00.jsonl:21: not valid JSON"):
        ensure_tokenizer(cfg([{"path": str(tmp_path / "c/*.jsonl")}], tokenizer={"vocab_size": 300}))
    assert list((tmp_path / "cache" / "tokenizers").iterdir()) == []
