"""Attention maps rebuilt from hooks are the model's own (the module output recomputed from them equals the real
one, sdpa kernel and all); outliers and quantised-logit losses; attention allocation; the two commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffllm.eval import attention, outliers
from diffllm.eval.maps import attention_map, capture, scores_transformed
from diffllm.eval.needle import Format, build_prompt
from diffllm.eval.outliers import Extremes, absmax_quantiser, outlier_stats, quantised_losses
from diffllm.model import variants


def tokens(tok, n=2, T=48):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 8
    ids = tok.encode(text)
    return torch.tensor([ids[i * 5 : i * 5 + T + 1] for i in range(n)])


@pytest.mark.parametrize("arch", list(variants()))
def test_maps_reproduce_the_models_attention_output(loaded, arch):
    cfg, model, tok = loaded(arch)
    assert cfg.attn_backend == "sdpa"
    x = tokens(tok)[:, :-1]
    with torch.no_grad():
        ref = model(x)
        with scores_transformed(model, None):
            rebuilt = model(x)
        with capture(model) as got:
            model(x)
    assert torch.allclose(rebuilt, ref, atol=2e-5), (rebuilt - ref).abs().max()
    for layer, (h, cos, sin) in zip(model.layers, got["inputs"]):
        m = attention_map(layer.attn, h, cos, sin)  # (B, heads, T, T)
        assert m.shape == (2, cfg.variant.heads(cfg).out, 48, 48)  # one map per output head
        assert torch.allclose(m.sum(-1), torch.ones(()), atol=1e-5)  # normalised rows
        assert (m.triu(1) == 0).all()  # causal
    assert len(got["hidden"]) == cfg.n_layers


def test_absmax_quantiser_grid_and_error():
    scores = torch.randn(2, 3, 16, 16) * 5
    for bits in (4, 8):
        q = absmax_quantiser(bits)(scores)
        mask = torch.ones(16, 16, dtype=torch.bool).tril()
        absmax = scores.abs().masked_fill(~mask, 0).amax(dim=(-2, -1), keepdim=True)
        step = absmax / (2 ** (bits - 1) - 1)
        assert torch.allclose(q / step, torch.round(q / step), atol=1e-4)  # on the grid
        assert (((q - scores).abs() <= step / 2 + 1e-6) | ~mask).all()


def test_extremes_match_a_full_sort():
    gen = torch.Generator().manual_seed(0)
    values = [torch.rand(1000, generator=gen) * (i + 1) for i in range(5)]
    e = Extremes()
    for v in values:
        e.add(v)
    every = torch.cat(values).sort(descending=True).values
    s = e.summary()
    assert [s[f"top{k}"] for k in (1, 2, 3, 10, 100)] == [float(every[k - 1]) for k in (1, 2, 3, 10, 100)]
    assert s["median"] == float(torch.cat(values).median()) and s["values"] == 5000  # all kept below the sample cap


@pytest.mark.parametrize("arch", list(variants()))
def test_outliers_and_quantised_losses(loaded, arch):
    cfg, model, tok = loaded(arch)
    batches = [tokens(tok)]
    stats = outlier_stats(model, batches)
    with torch.no_grad(), capture(model) as got:
        model(batches[0][:, :-1])
    assert stats["hidden_states"]["top1"] == pytest.approx(max(float(h.abs().max()) for h in got["hidden"]))
    lg = stats["attention_logits"]
    assert lg["top1"] >= lg["top2"] >= lg["top10"] >= lg["top100"] >= lg["median"] > 0
    losses = quantised_losses(model, batches, [16, 4])
    assert losses["16"] == pytest.approx(losses["fp32"], abs=1e-4)  # 16 bits: nothing lost
    assert losses["4"] != losses["fp32"]


@pytest.mark.parametrize("arch", list(variants()))
def test_allocation_shares(loaded, arch):
    cfg, model, tok = loaded(arch)
    p = build_prompt(Format("synthetic", tok), None, 2, 1, 50.0, 64, np.random.default_rng(0))
    got = attention.allocation(model, [p])
    with torch.no_grad(), capture(model) as cap:
        model(torch.tensor([p.ids[: p.answers[0][0]]]))
    pos = p.answers[0][0] - 1
    for i, (layer, (x, cos, sin)) in enumerate(zip(model.layers, cap["inputs"])):
        with torch.no_grad():
            row = attention_map(layer.attn, x, cos, sin)[0, :, pos].mean(0).double()
        s, e = p.needle
        assert got["answer"][i] == pytest.approx(float(row[s:e].sum()), abs=1e-6)
        assert got["answer"][i] + got["noise"][i] + float(row[p.question :].sum()) == pytest.approx(1.0, abs=1e-5)


def test_commands_write_results(runs, tmp_path, capsys):
    outliers.main([f"run={runs('diff')}", "tokens=256", "bits=[8,4]", "cloze_items=4", f"out={tmp_path}"])
    res = json.loads((tmp_path / "outliers.json").read_text())
    assert set(res["quantised_loss"]) == {"fp32", "8", "4"} and res["tokens"] >= 256
    assert (tmp_path / "outliers.md").read_text().startswith("| activation | top-1 |")
    attention.main([f"run={runs('transformer')}", "depths=[0,100]", "length=64", "trials=2", f"out={tmp_path}"])
    res = json.loads((tmp_path / "attention.json").read_text())
    assert set(res["by_depth"]) == {"0.0", "100.0"} and len(res["by_depth"]["0.0"]["answer"]) == 2
    with pytest.raises(SystemExit):
        attention.main([f"run={runs('diff')}", "length=1000"])
    assert "length=1000: exceeds the model's context (128)" in capsys.readouterr().err
