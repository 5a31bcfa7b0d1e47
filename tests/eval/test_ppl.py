"""eval ppl: loss and bits per byte equal a brute-force float64 computation, token by token; the command writes one
entry per source; bad input is one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from diffllm.eval.ppl import main, perplexity, windows

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n"
OTHER = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"


def brute_force(model, tok, texts: list[str], seq_len: int, doc_mask: bool = False) -> tuple[float, int, int]:
    """Summed nats of every document token, each predicted from its own window's prefix, in float64; with doc_mask,
    from the part of that prefix in the predicting position's own document (an EOS belongs to the one it ends)."""
    m = model.double()
    try:
        stream = [t for text in texts for t in [tok.eos_id] + tok.encode(text)]
        nats, count = 0.0, 0
        for p in range(1, len(stream)):
            if stream[p] == tok.eos_id:
                continue
            start = (p - 1) // seq_len * seq_len
            if doc_mask:  # position p - 1's document starts after the last EOS before it
                start = max([start] + [e + 1 for e in range(p - 1) if stream[e] == tok.eos_id])
            with torch.no_grad():
                logp = m(torch.tensor([stream[start:p]]))[0, -1].log_softmax(-1)
            nats -= float(logp[stream[p]])
            count += 1
    finally:
        model.float()
    return nats, count, sum(len(t.encode()) for t in texts)


@pytest.mark.parametrize("arch", ["transformer", "diff"])
@pytest.mark.parametrize("seq_len", [7, 128])
def test_bits_per_byte_equals_a_hand_computation(loaded, arch, seq_len):
    cfg, model, tok = loaded(arch)
    docs = [tok.encode(TEXT), tok.encode(OTHER)]
    got = perplexity(model, windows(docs, tok.eos_id, seq_len, batch_size=3), n_bytes=len((TEXT + OTHER).encode()))
    nats, count, n_bytes = brute_force(model, tok, [TEXT, OTHER], seq_len)
    assert got["tokens"] == count == len(docs[0]) + len(docs[1])
    assert got["loss"] == pytest.approx(nats / count, rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(nats / count), rel=1e-4)


@pytest.mark.parametrize("arch", ["transformer", "diff", "diff2"])
@pytest.mark.parametrize("restart", [False, True])
def test_doc_mask_scores_each_token_within_its_document(loaded, arch, restart):
    """Windows of several documents, attention within documents: each token as the hand computation predicts it from
    its own document's part of the window (positions from the window start or restarted: RoPE sees only relative
    positions, so both equal the document run alone)."""
    cfg, model, tok = loaded(arch)
    texts = [TEXT, OTHER, TEXT[:20], OTHER]
    docs = [tok.encode(t) for t in texts]
    got = perplexity(model, windows(docs, tok.eos_id, 40, batch_size=2, doc_mask=True, restart_positions=restart))
    plain = perplexity(model, windows(docs, tok.eos_id, 40, batch_size=2))
    nats, count, _ = brute_force(model, tok, texts, 40, doc_mask=True)
    assert got["tokens"] == count and got["loss"] == pytest.approx(nats / count, rel=1e-5)
    assert abs(plain["loss"] - got["loss"]) > 1e-4  # the windows do cross documents


def test_command_reports_each_source(runs, tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(TEXT)
    b.write_text(OTHER * 3)
    main([f"run={runs('diff')}", f"data=[{a},{b}]", "seq_len=16", f"out={tmp_path / 'out'}"])
    res = json.loads((tmp_path / "out" / "ppl.json").read_text())
    assert set(res["sources"]) == {"a", "b"} and res["arch"] == "diff" and res["seq_len"] == 16
    assert res["sources"]["a"]["bytes"] == len(TEXT.encode()) and res["sources"]["b"]["bytes"] == 3 * len(
        OTHER.encode()
    )
    err = capsys.readouterr().err
    assert "bits/byte" in err and "\r" not in err and "ppl a: " in err  # stderr no terminal: plain progress lines


def test_default_data_is_the_runs_held_out_sources(runs, tmp_path):
    main([f"run={runs('transformer')}", "max_tokens=300", f"out={tmp_path}"])
    res = json.loads((tmp_path / "ppl.json").read_text())
    assert list(res["sources"]) == ["plays-heldout"] and res["sources"]["plays-heldout"]["tokens"] == 300
    assert res["seq_len"] == 64  # the run's data.seq_len


def test_data_config_with_a_defaults_list(runs, tmp_path):
    """data=shakespeare-needle composes its base (shakespeare@_here_) as `diffllm train data=...` does: its held-out
    plays are those of the base, which the file itself does not list."""
    main([f"run={runs('transformer')}", "data=shakespeare-needle", "max_tokens=200", f"out={tmp_path}"])
    res = json.loads((tmp_path / "ppl.json").read_text())
    assert list(res["sources"]) == ["plays-heldout"] and res["sources"]["plays-heldout"]["tokens"] == 200


# The error names every data config the package ships: the files of configs/data, listed here by a glob.
DATA_CONFIGS = ", ".join(sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "configs/data").glob("*.yaml")))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run={empty}"], "no checkpoints"),
        (["run={missing}"], "no such directory"),
        (["run={run}", "seq_len=4096"], "longer than the model's context (128)"),
        (["run={run}", "data=nosuchdata"], f"data=nosuchdata: neither a data config ({DATA_CONFIGS}) nor a file"),
        (["run={run}", "batch_sise=3"], "ppl.batch_sise: unknown key; did you mean batch_size?"),
    ],
)
def test_bad_input_is_one_line(runs, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    fill = {"empty": tmp_path / "empty", "missing": tmp_path / "nope", "run": runs("diff")}
    with pytest.raises(SystemExit) as e:
        main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err
