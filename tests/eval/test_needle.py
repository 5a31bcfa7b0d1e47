"""eval needle: prompts hold exactly what they claim (length, needle at depth, answers); the teacher-forced verdict
equals real greedy decoding; the `needle` training source mixes with text and every query is answerable; the command
writes JSON, a markdown table and a heatmap; bad input is one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from diffllm.data.needle import NeedleSpec, documents
from diffllm.eval.generate import Sampling, decode, full_forward
from diffllm.eval.needle import Format, answers_correct, build_prompt, haystack_tokens, main


@pytest.mark.parametrize("mode", ["synthetic", "text"])
@pytest.mark.parametrize("depth", [0.0, 50.0, 100.0])
def test_prompt_layout(loaded, runs, mode, depth):
    from diffllm.runs import Run

    _, _, tok = loaded("diff")
    hay = haystack_tokens(Run(runs("diff")).config(), None, tok, 600) if mode == "text" else None
    fmt = Format(mode, tok)
    length = 120 if mode == "synthetic" else 128  # text needles are ~30 tokens with this 1024-token BPE
    r = 2 if mode == "synthetic" else 1
    p = build_prompt(fmt, hay, 3 if mode == "synthetic" else 2, r, depth, length, np.random.default_rng(7))
    assert len(p.ids) == length and len(p.answers) == r and len(set(p.keys)) == r
    needle = tok.decode(p.ids[p.needle[0] : p.needle[1]])
    answer = tok.decode(p.ids[p.answers[0][0] : p.answers[0][1]]).strip()
    assert p.keys[0] in needle and answer in needle  # the first query asks the answer needle
    for (s, e), key in zip(p.answers, p.keys):  # every answer is its key's value in the haystack
        value = tok.decode(p.ids[s:e]).strip()
        assert re.search(rf"{key} (is|number is:) {value}", tok.decode(p.ids[: p.question]))
    hay = [t for i, t in enumerate(p.ids[: p.question]) if not any(s <= i < e for s, e in p.needles)]
    before = p.needle[0] - sum(e - s for s, e in p.needles if e <= p.needle[0])  # haystack tokens before it
    target = depth / 100 * len(hay)
    assert all(abs(before - target) <= abs(c - target) for c in fmt.boundaries(hay))  # the nearest insertion point
    assert abs(before / len(hay) - depth / 100) < (0.1 if mode == "synthetic" else 0.5)


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_verdict_equals_greedy_decoding(loaded, arch):
    """Half the prompts get the model's own greedy continuation as 'answer' (so the verdict must be True), half
    keep the real answer (mostly wrong for a barely trained model): each verdict equals a real decode loop's."""
    cfg, model, tok = loaded(arch)
    fmt, prompts = Format("synthetic", tok), []
    for i in range(6):
        p = build_prompt(fmt, None, 2, 1, 50.0, 60, np.random.default_rng(i))
        s, e = p.answers[0]
        if i % 2 == 0:
            greedy, _ = decode(full_forward(model), p.ids[:s], e - s, Sampling())
            p.ids[s:e] = greedy
        prompts.append(p)
    verdicts = answers_correct(model, prompts, batch_size=4)
    for p, (ok,) in zip(prompts, verdicts):
        s, e = p.answers[0]
        emitted, _ = decode(full_forward(model), p.ids[:s], e - s, Sampling())
        assert ok == (emitted == p.ids[s:e])
    assert [v[0] for v in verdicts][0::2] == [True] * 3


def test_needle_source_mixes_with_text_and_every_query_is_answerable(tokenizer):
    from diffllm.config import build, compose
    from diffllm.data import DataConfig
    from diffllm.data.loader import resolve_sources
    from diffllm.data.stream import Stream

    spec = "needle:n_needles=2-4,queries=8,filler=30,docs=50"
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(compose("train", ["data.seq_len=64", "data.tokenizer.vocab_size=1024"]).data)
    node["sources"][0]["weight"] = 0.75  # the plays; the config a user writes: the same two entries in YAML
    node["sources"].append({"name": "needles", "format": "needle", "path": spec, "weight": 0.25})
    data = build(DataConfig, node, "data")
    stream = Stream(resolve_sources(data), tokenizer, data, 0, 1)
    texts = [tokenizer.decode(stream.next_window()[0]) for _ in range(200)]
    share = sum(" magic " in t and " is " in t for t in texts) / len(texts)
    assert 0.15 < share < 0.35  # weight 0.25 of the windows
    for _, doc, _ in documents(NeedleSpec.parse(spec), 0, 0, 1):
        facts = re.findall(r" magic (\w+) is (\w+) \.", doc)
        assert 2 + 8 <= len(facts) <= 4 + 8
        stated: dict = {}
        for key, value in facts:
            assert stated.setdefault(key, value) == value  # every repetition (query) repeats its needle's value
    assert list(documents(NeedleSpec.parse(spec), 0, 3, 7)) == list(documents(NeedleSpec.parse(spec), 0, 0, 1))[3::7]


@pytest.mark.parametrize(
    "path, message",
    [
        ("needle:queries=x", "queries='x' is not a number"),
        ("needle:n_needle=2", "unknown key 'n_needle'"),
        ("needle:n_needles=0", "needs 1 <= n_needles"),
    ],
)
def test_needle_source_spec_errors(path, message):
    from diffllm.data import DataConfig, DataError
    from diffllm.data.loader import resolve_sources

    with pytest.raises(DataError, match=re.escape(message)):
        resolve_sources(DataConfig(sources=[{"name": "n", "format": "needle", "path": path}]))


@pytest.mark.parametrize("mode", ["synthetic", "text"])
def test_command_writes_json_table_and_heatmap(runs, tmp_path, capsys, mode):
    lengths, queries = ("[64,128]", 2) if mode == "synthetic" else ("[112,128]", 1)
    main(
        [
            f"run={runs('transformer')}",
            f"mode={mode}",
            "n_needles=[1,2]",
            f"queries={queries}",
            "depths=[0,100]",
            f"lengths={lengths}",
            "trials=2",
            f"out={tmp_path}",
        ]
    )
    res = json.loads((tmp_path / f"needle-{mode}.json").read_text())
    assert len(res["cells"]) == 2 * 2 * 2 and set(res["by_n"]) == {"1", "2"}
    assert all(c["accuracy"] * 2 * queries % 1 == 0 for c in res["cells"] if c["n"] == 2)  # 2 trials x R queries
    assert (tmp_path / f"needle-{mode}.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / f"needle-{mode}.md").read_text()
    assert (
        table.startswith(f"| N | depth | {lengths[1:-1].replace(',', ' | ')} | mean |") and table.count("\n") == 2 + 4
    )
    assert "mean accuracy" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["lengths=[4096]"], "lengths: 4096 exceeds the model's context (128)"),
        (["mode=haystack"], "mode='haystack': expected one of"),
        (["lengths=[16]", "n_needles=[4]"], "16 tokens cannot hold 4 needles"),
    ],
)
def test_bad_input_is_one_line(runs, capsys, argv, message):
    with pytest.raises(SystemExit):
        main([f"run={runs('diff')}", *argv])
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_heatmap_is_titled_by_its_run():
    """Two runs of one preset (a sweep's) get two titles: the run's path first (its tail when long), then the preset."""
    from diffllm.eval.report import heatmap_title

    sweep = "runs/sweep/micro/diff-micro-1"
    res = {"model": "diff-micro-1", "arch": "diff", "step": 64, "mode": "synthetic"}
    a = heatmap_title({**res, "run": f"{sweep}/lr=0.008,lambda_init=0.8/seed1"})
    b = heatmap_title({**res, "run": f"{sweep}/lr=0.004,lambda_init=0.8/seed1"})
    assert a.splitlines() == [
        ".../diff-micro-1/lr=0.008,lambda_init=0.8/seed1",
        "diff-micro-1 (diff), step 64: synthetic needles",
    ]
    assert b.splitlines()[0] == ".../diff-micro-1/lr=0.004,lambda_init=0.8/seed1"
    assert heatmap_title({**res, "run": "runs/diff-tiny"}).splitlines()[0] == "runs/diff-tiny"
