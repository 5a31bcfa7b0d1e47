"""plays_cloze accuracy through eval outliers' quantised forward (diffllm/eval/cloze.py, outliers.quantised_accuracy):
each choice's score under 4- and 8-bit logits equals a float64 forward with the logits quantised by hand, one
sequence at a time, whatever the batch; the accuracy equals a count over those scores; unquantised (and at 16 bits)
it is the plain scorer's; the split of each choice is lm-eval's; and `eval outliers` reports it."""

from __future__ import annotations

import json

import pytest
import torch

from diffllm.eval import cloze, outliers
from diffllm.eval.outliers import quantised_accuracy
from diffllm.model import variants


def quantised_by_hand(scores: torch.Tensor, bits: int) -> torch.Tensor:
    """(B, H, T, T) float64 logits rounded to 2^(bits-1)-1 steps of each map's causal absmax."""
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    step = scores.masked_fill(~causal, 0).abs().flatten(-2).max(-1).values[..., None, None] / (2 ** (bits - 1) - 1)
    return torch.round(scores / step) * step


def float64_score(model, ctx: list[int], cont: list[int], bits) -> float:
    """sum log p(cont | ctx) of the one unpadded sequence ctx + cont, in float64, every (plain softmax) attention's
    logits quantised to `bits` (None: as they are) in a forward hook written here."""

    def attention(attn, args, out):
        x, cos, sin = args[:3]
        q, k, v = attn.project(x, cos, sin)  # (B, H, T, d), float64
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, T, T)
        s = quantised_by_hand(s, bits) if bits else s
        T = s.shape[-1]
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return attn.finish(x, s.softmax(-1) @ v)

    seq = ctx + cont
    m = model.double()
    hooks = [layer.attn.register_forward_hook(attention) for layer in m.layers]
    try:
        with torch.no_grad():
            logp = m(torch.tensor([seq[:-1]]))[0].log_softmax(-1)  # (T, V)
    finally:
        for h in hooks:
            h.remove()
        model.float()
    return float(sum(logp[i - 1, seq[i]] for i in range(len(ctx), len(seq))))


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_quantised_scores_equal_a_float64_forward_and_the_accuracy_a_count(loaded, bits):
    cfg, model, tok = loaded("transformer")
    assert cfg.n_kv_heads in (None, cfg.n_heads)  # the hook above reads k and v without GQA tiling
    task = cloze.items(3)
    long = tok.encode(" ".join(it.context for it in cloze.items(8)))[: cfg.max_seq_len - 8]
    pairs = [p for it in task for p in cloze.choice_pairs(tok, it)] + [(long, long[:4])]
    assert len({len(a) + len(b) for a, b in pairs}) > 3  # lengths differ: padded rows would change the scales
    ours = outliers.at_each_width(
        model, [bits] if bits else [], lambda: cloze.unpadded_scores(model, pairs, cfg.max_seq_len, batch_size=5)
    )[str(bits) if bits else "fp32"]
    ref = [float64_score(model, ctx, cont, bits) for ctx, cont in pairs]
    assert ours == pytest.approx(ref, abs=5e-5)  # fp32 vs fp64: ~1e-5; a padded batch: 1.6e-4 at 4 bits
    ref = ref[:-1]  # the items' choices
    right = sum(max(range(4), key=lambda j: ref[4 * i + j]) == it.label for i, it in enumerate(task))
    got = quantised_accuracy(model, tok, 3, [bits] if bits else [], batch_size=5)
    assert got[str(bits) if bits else "fp32"] == right / 3


def test_no_map_is_padded(loaded):
    """Every map the quantiser sees is one of a sequence's own length: padded rows would enter its absmax."""
    from collections import Counter

    from diffllm.eval.maps import scores_transformed

    cfg, model, tok = loaded("diff")
    pairs = [p for it in cloze.items(4) for p in cloze.choice_pairs(tok, it)]
    seen: Counter = Counter()

    def spy(scores):  # (B, H, T, T)
        seen[scores.shape[-1]] += scores.shape[0]
        return scores

    with scores_transformed(model, spy):
        cloze.unpadded_scores(model, pairs, cfg.max_seq_len, batch_size=3)
    lengths = Counter(len(ctx) + len(cont) - 1 for ctx, cont in pairs)  # the model's input: all but the last token
    assert len(lengths) > 1 and seen == Counter({T: n * cfg.n_layers for T, n in lengths.items()})


@pytest.mark.parametrize("arch", list(variants()))
def test_unquantised_and_16_bit_accuracy_are_the_plain_scorers(loaded, arch):
    from diffllm.eval.common import score_continuations

    cfg, model, tok = loaded(arch)
    task = cloze.items(12)
    pairs = [p for it in task for p in cloze.choice_pairs(tok, it)]
    plain = [ll for ll, _ in score_continuations(model, pairs, cfg.max_seq_len, 7)]  # padded batches, no hooks
    count = sum(max(range(4), key=lambda j: plain[4 * i + j]) == it.label for i, it in enumerate(task))
    got = quantised_accuracy(model, tok, 12, [16], batch_size=16)
    assert got == {"fp32": count / 12, "16": count / 12}


def test_choices_are_split_as_lm_eval_splits_them(loaded):
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install 'diffllm[eval]'")
    from lm_eval.api.model import TemplateLM

    _, _, tok = loaded("transformer")

    class Split(TemplateLM):  # lm-eval's own _encode_pair over our tokenizer
        backend = "causal"
        eot_token_id = tok.eos_id

        def tok_encode(self, s, **kw):
            return tok.encode(s)

        loglikelihood_rolling = generate_until = _loglikelihood_tokens = None

    lm = Split()
    odd = cloze.Item("To be, or not to be: that is the question:  ", ["Whether 'tis nobler", "in the mind"], 0)
    for it in cloze.items(20) + [odd]:
        assert cloze.choice_pairs(tok, it) == [lm._encode_pair(it.context, "\n" + c) for c in it.choices]


def test_eval_outliers_reports_the_accuracy(runs, tmp_path, capsys):
    outliers.main([f"run={runs('diff')}", "tokens=128", "bits=[4]", "cloze_items=8", f"out={tmp_path}"])
    res = json.loads((tmp_path / "outliers.json").read_text())
    n = f"{res['tokens']:,}"
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("[diffllm.eval]")] == [
        # what it does, as it goes (issue 56: 59 s without a line at the defaults)
        f"[diffllm.eval] {runs('diff')}: top-k attention logits and hidden states over {n} held-out tokens "
        "(64-token windows)",
        f"[diffllm.eval] loss over {n} tokens at fp32 attention logits (1/2)",
        f"[diffllm.eval] loss over {n} tokens at 4-bit attention logits (2/2)",
        "[diffllm.eval] plays_cloze accuracy (8 items) at fp32 attention logits (1/2)",
        "[diffllm.eval] plays_cloze accuracy (8 items) at 4-bit attention logits (2/2)",
        f"[diffllm.eval] {n} tokens; wrote {tmp_path}/outliers.{{json,md}}",
    ]
    assert set(res["quantised_accuracy"]) == {"fp32", "4"}
    assert res["accuracy_task"] == {"task": "plays_cloze", "items": 8, "chance": 0.25}
    assert all(v * 8 == round(v * 8) for v in res["quantised_accuracy"].values())  # a count of 8 items
    assert "| plays_cloze accuracy (8 items) |" in (tmp_path / "outliers.md").read_text()
    outliers.main([f"run={runs('diff')}", "tokens=128", "bits=[4]", "cloze_items=0", f"out={tmp_path}"])
    assert "quantised_accuracy" not in json.loads((tmp_path / "outliers.json").read_text())


def test_a_negative_cloze_items_is_one_line(runs, capsys):
    with pytest.raises(SystemExit) as e:
        outliers.main([f"run={runs('diff')}", "cloze_items=-1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "diffllm eval outliers: error: cloze_items=-1: want >= 0 (0: no accuracy)\n"
