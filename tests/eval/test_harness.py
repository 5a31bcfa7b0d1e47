"""eval lm-eval: the TemplateLM adapter's log-likelihoods equal a brute-force float64 scorer, choice by choice; rolling
log-likelihoods and generations equal ours; a full offline harness run on the local plays_cloze task reports the
accuracy our own scoring gives; an unknown task is one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install 'diffllm[eval]'")

from lm_eval.api.instance import Instance  # noqa: E402

from diffllm.eval.generate import generate  # noqa: E402
from diffllm.eval.harness import TASKS_DIR, adapter, evaluate, main  # noqa: E402


def brute_loglikelihood(model, tok, context: str, continuation: str) -> float:
    """sum log p(continuation tokens | context) in float64, the continuation being what the joint encoding adds."""
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    m = model.double()
    try:
        with torch.no_grad():
            logp = m(torch.tensor([whole[:-1]]))[0].log_softmax(-1)
    finally:
        model.float()
    return float(sum(logp[i - 1, whole[i]] for i in range(len(ctx), len(whole))))


def items(n: int) -> list[dict]:
    return [json.loads(x) for x in (TASKS_DIR / "plays_cloze" / "plays_cloze.jsonl").read_text().splitlines()[:n]]


def request(kind: str, args: tuple, i: int = 0) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_per_choice_loglikelihoods_equal_our_scorer(loaded, arch):
    _, model, tok = loaded(arch)
    lm = adapter(model, tok, batch_size=3)
    reqs = [(it["context"], "\n" + c) for it in items(3) for c in it["choices"]]
    got = lm.loglikelihood([request("loglikelihood", r, i) for i, r in enumerate(reqs)])
    for (ctx, cont), (ll, _) in zip(reqs, got):
        assert ll == pytest.approx(brute_loglikelihood(model, tok, ctx, cont), abs=2e-4)


def test_rolling_and_generation(loaded):
    from diffllm.eval.ppl import perplexity, windows

    cfg, model, tok = loaded("diff")
    long = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 10
    ids = tok.encode(long)[: 2 * cfg.max_seq_len]  # two whole windows: lm-eval's rolling windows are then ours
    text = tok.decode(ids)
    assert tok.encode(text) == ids
    (rolled,) = adapter(model, tok).loglikelihood_rolling([request("loglikelihood_rolling", (text,))])
    ours = perplexity(model, windows([ids], tok.eos_id, cfg.max_seq_len, 4))
    assert rolled == pytest.approx(-ours["loss"] * ours["tokens"], rel=1e-5)  # the same disjoint windows
    prompt = "KING RICHARD II:\n"
    (gen,) = adapter(model, tok).generate_until(
        [request("generate_until", (prompt, {"until": ["\n"], "max_gen_toks": 16}))]
    )
    assert gen == generate(model, tok, prompt, 16, stop=("\n",))["text"]


@pytest.mark.slow
def test_offline_harness_run_reports_our_accuracy(loaded):
    _, model, tok = loaded("transformer")
    res = evaluate(model, tok, ["plays_cloze"], limit=8)
    ours = []
    for it in items(8):
        scores = [brute_loglikelihood(model, tok, it["context"], "\n" + c) for c in it["choices"]]
        ours.append(scores.index(max(scores)) == it["label"])
    assert res["results"]["plays_cloze"]["acc,none"] == pytest.approx(sum(ours) / len(ours))


@pytest.mark.slow
def test_unknown_task_is_one_line(runs, capsys):
    with pytest.raises(SystemExit):
        main([f"run={runs('diff')}", "tasks=[plays_clozе]"])
    main_err = capsys.readouterr().err
    assert "tasks: unknown task 'plays_clozе'; did you mean plays_cloze?" in main_err and main_err.count("\n") == 1


def test_the_git_probe_is_quiet_outside_a_repository(tmp_path, monkeypatch, capfd):
    """The probe simple_evaluate calls (looked up in lm_eval.evaluator when it runs), in a folder outside git."""
    import lm_eval.evaluator

    from diffllm.eval.harness import quiet_git_probe

    monkeypatch.chdir(tmp_path)
    with quiet_git_probe():
        assert lm_eval.evaluator.get_git_commit_hash() is None
    assert "not a git repository" not in capfd.readouterr().err


@pytest.mark.slow
def test_no_git_message_outside_a_repository(loaded, tmp_path, monkeypatch, capfd):
    """lm-eval records the current folder's git commit with `git describe`: outside a repository git's "fatal: not a
    git repository" stays off the terminal (fd 2, where the git process writes)."""
    _, model, tok = loaded("transformer")
    monkeypatch.chdir(tmp_path)
    res = evaluate(model, tok, ["plays_cloze"], limit=2)
    assert "plays_cloze" in res["results"] and res["git_hash"] is None
    assert "not a git repository" not in capfd.readouterr().err
