"""eval ppl by_position=true: every position's NLL and the cumulative curve equal a float64 token-by-token loop (the
model run in float64 on each prefix); contexts past the training length are labelled; bad input is one line, found
before the weights are read."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffllm.eval.by_position import buckets, curves, score_docs
from diffllm.eval.ppl import main

TEXT = (
    "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer the slings and arrows of "
    "outrageous fortune, or to take arms against a sea of troubles, and by opposing end them. To die, to sleep; no "
    "more; and by a sleep to say we end the heart-ache and the thousand natural shocks that flesh is heir to.\n"
)
OTHER = (
    "Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds that lour'd "
    "upon our house in the deep bosom of the ocean buried. Now are our brows bound with victorious wreaths.\n"
)


def token_by_token(model, eos: int, docs: list[list[int]]) -> np.ndarray:
    """(D, T) NLL of each document token from the model run in float64 on its own prefix EOS d[0] ... d[t-1]."""
    m = model.double()
    try:
        out = np.zeros((len(docs), len(docs[0])))
        with torch.no_grad():
            for i, d in enumerate(docs):
                for t in range(len(d)):
                    logp = m(torch.tensor([[eos] + d[:t]]))[0, -1].log_softmax(-1)
                    out[i, t] = -float(logp[d[t]])
    finally:
        model.float()
    return out


def test_buckets_are_powers_of_two():
    assert buckets(1) == [(1, 1)]
    assert buckets(10) == [(1, 1), (2, 3), (4, 7), (8, 10)]
    assert buckets(8) == [(1, 1), (2, 3), (4, 7), (8, 8)]


@pytest.mark.parametrize(
    "arch", [pytest.param("transformer", marks=pytest.mark.slow), "diff", pytest.param("diff2", marks=pytest.mark.slow)]
)
def test_every_position_equals_a_float64_loop(loaded, arch):
    """Positions 1..70 of two documents, 70 > the run's training length 64 (extrapolation), in batches of 1 and 2:
    each position's NLL, the per-position mean, the cumulative average and each bucket equal the loop within 1e-10
    when the model runs in float64; in float32 within 1e-4."""
    cfg, model, tok = loaded(arch)
    T = 70
    docs = [tok.encode(t * 2)[:T] for t in (TEXT, OTHER)]
    assert all(len(d) == T for d in docs)
    ref = token_by_token(model, tok.eos_id, docs)
    try:
        got64 = score_docs(model.double(), docs, tok.eos_id, batch_size=2)
        one_by_one = score_docs(model, docs, tok.eos_id, batch_size=1)
    finally:
        model.float()
    np.testing.assert_allclose(got64, ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(one_by_one, ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(score_docs(model, docs, tok.eos_id, batch_size=2), ref, rtol=0, atol=1e-4)
    c = curves(got64, train_len=64)
    by_pos = ref.mean(0)
    np.testing.assert_allclose(c["nll_by_position"], by_pos, rtol=0, atol=1e-10)
    cum = [sum(by_pos[: t + 1]) / (t + 1) for t in range(T)]  # mean over positions 1..t, by hand
    np.testing.assert_allclose(c["cumulative_nll"], cum, rtol=0, atol=1e-10)
    last = c["buckets"][-1]
    assert (last["from"], last["to"], last["extrapolation"]) == (64, 70, True)
    assert last["nll"] == pytest.approx(ref[:, 63:].mean(), abs=1e-10)
    assert last["se"] == pytest.approx(ref[:, 63:].mean(1).std(ddof=1) / np.sqrt(2), abs=1e-10)
    assert [b["extrapolation"] for b in c["buckets"]] == [False] * 6 + [True]


def test_command_writes_table_json_and_plot_past_the_model_context(runs, tmp_path, capsys):
    """seq_len=160 is past the training length (64) and model.max_seq_len (128): scored with RoPE as trained and
    labelled; the short document is skipped and counted, not padded."""
    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text(TEXT * 3)
    short.write_text(OTHER)
    other = tmp_path / "b.txt"
    other.write_text(OTHER * 4)
    main([f"run={runs('diff')}", f"data=[{long},{other}]", "seq_len=160", "by_position=true", f"out={tmp_path / 'o'}"])
    out = capsys.readouterr()
    res = json.loads((tmp_path / "o" / "ppl_by_position.json").read_text())
    assert res["seq_len"] == 160 and res["train_seq_len"] == 64 and res["extrapolation"] is True
    assert set(res["sources"]) == {"long", "b"}
    s = res["sources"]["long"]
    assert s["documents"] == 1 and s["skipped_short"] == 0 and len(s["cumulative_nll"]) == 160
    assert s["cumulative_nll"][-1] == pytest.approx(s["loss"])
    assert "| long | 128-160 |" in out.out and "extrapolation" in out.out  # the table on stdout
    assert "positions past 64 are extrapolation" in out.err
    assert (tmp_path / "o" / "ppl_by_position.png").stat().st_size > 0
    assert not (tmp_path / "o" / "ppl.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["seq_len=100000"], "seq_len=100000: longer than every document of source 'a' (1 documents, the longest"),
        (["seq_len=8", "batch_size=0"], "batch_size=0: must be >= 1"),
        (["seq_len=8", "max_docs=0"], "max_docs=0: must be >= 1"),
    ],
)
def test_bad_input_is_one_line_before_the_weights(runs, tmp_path, capsys, monkeypatch, argv, message):
    from diffllm.runs import Run

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the arguments were checked")

    monkeypatch.setattr(Run, "model", no_weights)
    a = tmp_path / "a.txt"
    a.write_text(TEXT)
    with pytest.raises(SystemExit) as e:
        main([f"run={runs('diff')}", f"data=[{a}]", "by_position=true", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_compare_overlays_each_runs_cumulative_curve(runs, tmp_path):
    """Two runs with ppl_by_position.json (written by the command): `eval compare` keeps each in compare.json and
    draws one curve per run in a panel of its own, its points the run's cumulative curve; never computed there."""
    import shutil

    from diffllm.eval import compare

    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 3)
    dirs = []
    for arch in ("transformer", "diff"):
        run = tmp_path / "sweep" / arch
        shutil.copytree(runs(arch), run, ignore=shutil.ignore_patterns("eval"))
        main([f"run={run}", f"data=[{doc}]", "seq_len=80", "by_position=true"])
        dirs.append(str(run))
    bare = tmp_path / "sweep" / "bare"  # a run without the results: no curve, nothing computed
    shutil.copytree(runs("diff"), bare, ignore=shutil.ignore_patterns("eval"))
    results = compare.run_compare(compare.CompareConfig(runs=dirs + [str(bare)], evals=[], compute=False))
    assert results[str(bare)]["ppl_by_position"] is None and not (bare / "eval").exists()
    fig = compare.figure(results, compare.labels(list(results)))
    (ax,) = fig.axes
    curves_drawn = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines() if line.get_label()[0] != "_"}
    for run in dirs:
        want = json.loads((tmp_path / run / "eval" / "ppl_by_position.json").read_text())
        assert curves_drawn[compare.labels(list(results))[run]] == want["sources"]["doc"]["cumulative_nll"]
    assert len(curves_drawn) == 2
    assert (tmp_path / "sweep" / "compare" / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("restart", [False, True])
def test_doc_mask_runs_score_as_they_trained(loaded, restart):
    """With document masks (a doc_mask run) the leading EOS is a document of its own (it ends the one before): the
    first token is predicted from the EOS alone, every later one from the document's tokens only; RoPE sees relative
    positions, so restarting them changes nothing. Checked against the float64 loop on those prefixes."""
    _, model, tok = loaded("diff")
    doc = tok.encode(TEXT)[:20]
    m = model.double()
    try:
        got = score_docs(m, [doc], tok.eos_id, batch_size=1, doc_mask=True, restart=restart)[0]
        with torch.no_grad():
            want = [-float(m(torch.tensor([[tok.eos_id]]))[0, -1].log_softmax(-1)[doc[0]])]
            want += [-float(m(torch.tensor([doc[:t]]))[0, -1].log_softmax(-1)[doc[t]]) for t in range(1, len(doc))]
        plain = score_docs(m, [doc], tok.eos_id, batch_size=1)[0]
    finally:
        model.float()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    assert abs(plain[1:] - got[1:]).max() > 1e-6  # the mask does change what the later tokens see
