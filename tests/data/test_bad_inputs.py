"""Bad input gives a one-line DataError that names the file (or config key) and the problem."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from diffllm.data import DataError, build_train_loader, build_val_batches
from diffllm.data.loader import resolve_sources
from diffllm.data.stream import Stream

from .helpers import cfg, corpus, make_docs, split_docs, write_jsonl


def error_of(fn) -> str:
    with pytest.raises(ValueError) as e:  # DataError, or the config layer's ValueError
        fn()
    msg = str(e.value)
    assert "\n" not in msg, f"not one line: {msg!r}"
    return msg


def first_batch(data, tok):
    return next(build_train_loader(data, tok, 0, 1, 1)).tokens


@pytest.mark.parametrize("workers", [0, 1])
def test_missing_text_field(tmp_path, tok, workers):
    write_jsonl(tmp_path / "docs.jsonl", make_docs("m", 5, 0), field="body")
    msg = error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "docs.jsonl")}], num_workers=workers), tok))
    assert "docs.jsonl: example 0 has no field 'text' (fields: body, id)" in msg


def test_text_field_that_is_not_text(tmp_path, tok):
    (tmp_path / "n.jsonl").write_text('{"text": 1}\n{"text": 2}\n')
    assert "n.jsonl: field 'text' holds int64, not text" in error_of(
        lambda: first_batch(cfg([{"path": str(tmp_path / "n.jsonl")}]), tok)
    )


def as_unprivileged(fn) -> str:
    """fn() in a forked child that runs as `nobody` when this process is root (as `make test` is in CI), so that a
    file without read permission is really unreadable; returns the child's error message."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run, send the one-line message back
        os.close(read)
        msg = "no error"
        try:
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            fn()
        except ValueError as e:
            msg = str(e)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test
            msg = f"unexpected {type(e).__name__}: {e}"
        os.write(write, msg.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    return msg


def test_unreadable_file(tok):
    work = Path(tempfile.mkdtemp(prefix="diffllm-unreadable-"))
    try:
        work.chmod(0o755)  # traversable by the unprivileged child; the file itself is not readable
        path = write_jsonl(work / "locked.jsonl", make_docs("u", 3, 0))
        path.chmod(0)
        msg = as_unprivileged(lambda: build_train_loader(cfg([{"path": str(path)}]), tok, 0, 1, 1))
        assert f"{path}: cannot read (Permission denied)" in msg and "\n" not in msg, msg
    finally:
        shutil.rmtree(work)


def test_file_that_vanishes(tmp_path, tok):
    write_jsonl(tmp_path / "a.jsonl", make_docs("a", 3, 0))
    path = write_jsonl(tmp_path / "b.jsonl", make_docs("b", 3, 1))
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], shuffle_files=False, tokenize_chars=1)
    before = build_train_loader(data, tok, 0, 1, 1)
    during = build_train_loader(data, tok, 0, 1, 1)
    next(during)  # a.jsonl is being read, b.jsonl not yet
    path.unlink()
    assert f"source 'all': cannot open its json files (FileNotFoundError: Unable to find '{path}')" in error_of(
        lambda: next(before)
    )
    msg = error_of(lambda: [next(during) for _ in range(50)])
    assert f"{path}: cannot read json (FileNotFoundError" in msg


def test_missing_files(tmp_path, tok):
    assert "nothing/*.jsonl: no files match" in error_of(
        lambda: first_batch(cfg([{"path": str(tmp_path / "nothing/*.jsonl")}]), tok)
    )
    assert "gone.jsonl: no such file" in error_of(
        lambda: first_batch(cfg([{"path": str(tmp_path / "gone.jsonl")}]), tok)
    )


def test_empty_source(tmp_path, tok):
    (tmp_path / "zero.jsonl").write_bytes(b"")
    assert f"{tmp_path / 'zero.jsonl'}: empty file" in error_of(
        lambda: first_batch(cfg([{"path": str(tmp_path / "zero.jsonl")}]), tok)
    )
    write_jsonl(tmp_path / "blank.jsonl", ["", None, "", "", ""])
    msg = error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "blank.jsonl")}]), tok))
    assert "source 'blank': a stream read a whole epoch without a document (5 empty)" in msg


def test_corrupt_parquet(tmp_path, tok):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": make_docs("g", 20, 0)}), good)
    raw = good.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(raw[: len(raw) // 2])  # truncated: footer gone
    msg = error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "*.parquet")}]), tok))
    assert f"{tmp_path / 'cut.parquet'}: corrupt parquet (no PAR1 magic at start and end" in msg
    (tmp_path / "cut.parquet").write_bytes(raw[:4] + b"\0" * (len(raw) - 8) + raw[-4:])  # magic kept, footer zeroed
    msg = error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "*.parquet")}]), tok))
    assert f"{tmp_path / 'cut.parquet'}: corrupt parquet footer (" in msg
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")  # magic and footer kept, column data zeroed
    (tmp_path / "cut.parquet").write_bytes(raw[:4] + b"\0" * (footer - 4) + raw[footer:])
    msg = error_of(lambda: [next(build_train_loader(cfg([{"path": str(tmp_path / "cut.parquet")}]), tok, 0, 1, 1))])
    assert f"{tmp_path / 'cut.parquet'}: cannot read parquet (OSError: " in msg


def test_parquet_reads_like_jsonl(tmp_path, tok):
    docs = make_docs("q", 30, 0)
    pq.write_table(pa.table({"text": docs}), tmp_path / "d.parquet")
    write_jsonl(tmp_path / "d.jsonl", docs)
    a = next(build_train_loader(cfg([{"path": str(tmp_path / "d.parquet")}]), tok, 0, 1, 4)).tokens
    b = next(build_train_loader(cfg([{"path": str(tmp_path / "d.jsonl")}]), tok, 0, 1, 4)).tokens
    assert (a == b).all()


def test_invalid_json_line(tmp_path, tok):
    path = write_jsonl(tmp_path / "j.jsonl", make_docs("j", 3, 0))
    with open(path, "a") as f:
        f.write('{"text": "unterminated\n')
    msg = error_of(lambda: [next(build_train_loader(cfg([{"path": str(path)}], seq_len=3000), tok, 0, 1, 1))])
    assert msg == (
        f"{path}:4: not valid JSON (Unterminated string starting at, column 10; 1 such line(s) in the file); fix or "
        "delete it, or set data.on_bad_record=skip to skip such records and count them"
    )


def test_on_bad_record_skip_skips_and_counts_each_malformed_line_once(tmp_path, tok):
    """Three bad lines (cut short, not JSON, and the file's cut last line) among 40 records, read by two streams:
    data.on_bad_record=skip yields every valid record exactly once and counts each bad line once."""
    docs = make_docs("s", 40, 0)
    lines = [json.dumps({"text": t}) for t in docs]
    lines.insert(5, '{"text": "cut sh')
    lines.insert(20, "not json at all")
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + '\n{"text": "the last line, cut')
    assert error_of(lambda: first_batch(cfg([{"path": str(path)}]), tok)).startswith(f"{path}:6: not valid JSON (")
    with pytest.raises(DataError, match="data.on_bad_record: got 'drop', expected one of"):
        cfg([{"path": str(path)}], on_bad_record="drop")
    data = cfg([{"path": str(path)}], on_bad_record="skip")
    read, bad = [], 0
    for s in range(2):
        stream = Stream(resolve_sources(data), tok, data, s, 2, epochs=1)
        windows = []
        with contextlib.suppress(StopIteration):
            while True:
                windows.append(stream.next_window()[0])
        read += split_docs(np.concatenate(windows + [p.tail() for p in stream.packers]), tok)
        bad += stream.state()["sources"]["s"]["bad_records"]
    assert sorted(read) == sorted(docs) and bad == 3


def test_an_empty_shard_among_good_ones_is_named_with_the_way_to_leave_it_out(tmp_path, tok):
    corpus(tmp_path, n_files=3, docs_per_file=10)
    (tmp_path / "part-03.jsonl").write_bytes(b"")
    msg = error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "*.jsonl")}]), tok))
    assert msg == (
        f"{tmp_path / 'part-03.jsonl'}: empty file (0 bytes); delete it, or leave it out with data.sources[0].exclude: "
        "['part-03.jsonl'] in the data config"
    )
    first_batch(cfg([{"path": str(tmp_path / "*.jsonl"), "exclude": ["part-03.jsonl"]}]), tok)  # the hint works


def test_config_errors_name_the_key(tmp_path, tok):
    path = write_jsonl(tmp_path / "x.jsonl", ["a"])
    assert "data.sources[0].pth" in error_of(lambda: cfg([{"pth": str(path)}]))
    assert "data.sources[0].format: got 'csv'" in error_of(lambda: cfg([{"path": str(path), "format": "csv"}]))
    assert "data.sources[0].weight: must be > 0" in error_of(lambda: cfg([{"path": str(path), "weight": 0}]))
    assert "source name 'x' is used twice" in error_of(lambda: cfg([{"path": str(path)}, {"path": str(path)}]))
    (tmp_path / "y.csv").write_text("text\nabc\n")
    assert "cannot infer the format of" in error_of(lambda: first_batch(cfg([{"path": str(tmp_path / "y.csv")}]), tok))
    assert "data.val: empty" in error_of(lambda: build_val_batches(cfg([{"path": str(path)}]), tok, 1, 1))


@pytest.mark.parametrize("command", [["train"], ["tokenizer", "train"]])
@pytest.mark.parametrize("size", ["-5", "0", str(1 << 32)])
def test_a_tokenizer_size_out_of_range_is_one_line(command, size, tmp_path, monkeypatch, capsys):
    """data.tokenizer.vocab_size=-5 was an OverflowError traceback from the tokenizers library (under train and
    tokenizer train) and 0 silently became 257 (issue 56): one line stating the valid range, exit code 2, before any
    tokenizer is trained."""
    from diffllm.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["diffllm"])
    with pytest.raises(SystemExit) as e:
        main([*command, f"data.tokenizer.vocab_size={size}"])
    err = capsys.readouterr().err
    prog = "diffllm " + " ".join(command)
    assert e.value.code == 2 and err == (
        f"{prog}: error: data.tokenizer.vocab_size: got {size}, expected 1 to 2,147,483,647 tokens (a byte-level BPE "
        "holds at least its 256 byte tokens and its special tokens; a smaller size grows to that, with a warning)\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["blob.txt", "blob.jsonl"])
def test_binary_file_is_refused_up_front(tmp_path, tok, name):
    """A file of random bytes is refused from its first 8 KiB when the loader is built, before any training."""
    path = tmp_path / name
    path.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)))
    msg = error_of(lambda: build_train_loader(cfg([{"path": str(path)}]), tok, 0, 1, 1))
    assert msg.startswith(f"{path}: not UTF-8 text (") and "in its first 8,192 bytes" in msg and "exclude" in msg


def test_utf16_file_is_refused_and_latin1_accents_pass(tmp_path, tok):
    text = "Ô rage ! ô désespoir ! ô vieillesse ennemie !\n" * 200
    (tmp_path / "u16.txt").write_bytes(text.encode("utf-16"))
    assert "NUL bytes in its first" in error_of(
        lambda: build_train_loader(cfg([{"path": str(tmp_path / "u16.txt")}]), tok, 0, 1, 1)
    )
    (tmp_path / "l1.txt").write_bytes(text.encode("latin-1"))  # 4 of 46 characters undecodable: read, and counted
    loader = build_train_loader(cfg([{"path": str(tmp_path / "l1.txt"), "sample_by": "line"}]), tok, 0, 1, 1)
    [next(loader) for _ in range(5)]
    assert loader.state_dict()["consumed"]["l1"]["undecodable"] >= 4
