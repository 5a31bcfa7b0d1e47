"""eval attention task=recall: each query's pair span holds the tokens " k v" of the binding it asks for (and the
segmented documents pack as before); the answer and noise masses equal a float64 softmax computed by hand from one
layer's q and k; Transformer rows sum to 1 over answer, noise and question; Diff rows too; the command writes its
JSON and table and refuses bad input in one line. Tiny random models built in this process, no training."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from diffllm.data.batch import Marked
from diffllm.data.packing import Packer
from diffllm.eval import attention
from diffllm.eval.maps import attention_map, capture
from diffllm.eval.recall import RecallTask, task_prompts
from diffllm.model import DecoderLM, ModelConfig
from diffllm.model.layers import apply_rotary
from diffllm.runs import Run

TASK = RecallTask(n=[1, 3, 6], gaps=[0, 5], lengths=[29, 40], trials=3)  # 29 = 4 x 6 + 5: no leading filler


def tiny(arch: str, tok, sharpen: float = 8.0) -> DecoderLM:
    """A random 2-layer model (GQA 4/2) whose q and k weights are scaled up so that its rows are far from uniform."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=tok.vocab_size, max_seq_len=128
    )
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                w.mul_(sharpen)
    return model


def words(tok, ids) -> list[str]:
    return tok.decode(ids).split()


def test_pair_spans_hold_the_queried_binding(tokenizer):
    for (n, gap, length), prompts in task_prompts(TASK, tokenizer, 128).items():
        for p in prompts:
            assert len(p.pairs) == len(p.answers) == n
            assert words(tokenizer, p.ids[p.question :]) == words(tokenizer, p.ids[1:])[-2 * n :]  # the queries
            for (s, e), (ps, pe) in zip(p.answers, p.pairs):
                key, value = words(tokenizer, p.ids[p.question : s])[-1], tokenizer.decode(p.ids[s:e])
                assert tokenizer.decode(p.ids[ps:pe]) == f" {key}{value}"  # " k v" of the binding asked for
            spans = sorted(p.pairs)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # the N pairs, one block
            assert len(words(tokenizer, p.ids[spans[-1][1] : p.question])) == gap  # then the gap, then the queries
            assert len(words(tokenizer, p.ids[1 : spans[0][0]])) == length - 4 * n - gap  # after the leading filler


def test_segmented_documents_pack_as_one_context_segment(tokenizer):
    """The packer's tokens and marks for a document whose context is split per pair equal those of the same document
    with its unmarked context as one segment (the layout before pair spans)."""
    from diffllm.data.recall import recall_document

    rng, docs = np.random.default_rng(0), []
    for n, gap, length in [(1, 0, 4), (3, 0, 12), (4, 7, 40), (8, 16, 64)]:
        doc = recall_document(rng, n, gap, length, "test")
        context = [t for t, c in doc.parts[: -2 * n]]
        assert len(context) == n + (length > 4 * n + gap) + (gap > 0)  # pad | one per pair | gap
        docs += [doc, Marked([("".join(context), False)] + list(doc.parts[-2 * n :]))]
    packed = Packer._tokenize(SimpleNamespace(tok=tokenizer), docs)
    for (toks, marks), (toks1, marks1) in zip(packed[0::2], packed[1::2]):
        assert np.array_equal(toks, toks1) and np.array_equal(marks, marks1)


@torch.no_grad()
def rows_by_hand(model: DecoderLM, ids: list[int], layer: int, positions: list[int]) -> np.ndarray:
    """(P, T) float64 Transformer rows at `positions`, mean over heads: softmax(q k^T / sqrt d + causal) with q and
    k projected, rotated and multiplied here from the layer's own input and weights."""
    attn, got = model.layers[layer].attn, []
    hook = attn.register_forward_pre_hook(lambda m, args: got.append(args[:3]))
    model(torch.tensor([ids]))
    hook.remove()
    x, cos, sin = (t.double() for t in got[0])  # x: (1, T, E)
    T, H, Hkv, d = x.shape[1], attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = (x @ attn.q_proj.weight.double().T).view(1, T, H, d)
    k = (x @ attn.k_proj.weight.double().T).view(1, T, Hkv, d)
    q, k = apply_rotary(q, cos, sin, attn.interleaved)[0], apply_rotary(k, cos, sin, attn.interleaved)[0]  # (T, H*, d)
    out = []
    for pos in positions:
        heads = []
        for h in range(H):
            s = (k[: pos + 1, h // (H // Hkv)] @ q[pos, h]).numpy() / np.sqrt(d)  # (pos + 1,): keys up to pos
            heads.append(np.pad(np.exp(s - s.max()) / np.exp(s - s.max()).sum(), (0, T - pos - 1)))
        out.append(np.mean(heads, axis=0))
    return np.array(out)


def test_transformer_masses_equal_a_float64_softmax_by_hand(tokenizer):
    model = tiny("transformer", tokenizer)
    task = RecallTask(n=[4], gaps=[3], lengths=[30], trials=2)
    prompts = next(iter(task_prompts(task, tokenizer, 128).values()))
    got = attention.recall_allocation(model, prompts)
    for layer in range(2):
        answer, noise, question = [], [], []
        for p in prompts:
            positions = [s - 1 for s, _ in p.answers]
            for row, (ps, pe) in zip(rows_by_hand(model, p.ids, layer, positions), p.pairs):
                answer.append(row[ps:pe].sum())
                noise.append(row[: p.question].sum() - row[ps:pe].sum())
                question.append(row[p.question :].sum())
        assert got["answer"][layer] == pytest.approx(np.mean(answer), abs=1e-5)
        assert got["noise"][layer] == pytest.approx(np.mean(noise), abs=1e-5)
        assert got["answer"][layer] + got["noise"][layer] + np.mean(question) == pytest.approx(1.0, abs=1e-5)
    assert max(got["answer"]) > 0.1 and min(got["noise"]) > 0.05  # sharpened rows: both masses are far from zero


def test_diff_rows_sum_to_one_over_answer_noise_and_question(tokenizer):
    """Diff rows (the normalised differential map, entries may be negative): the masses are those of the map of the
    whole prompt (causal: the rows do not see the tokens after them) and sum to 1 with the question's share."""
    model = tiny("diff", tokenizer)
    prompts = next(iter(task_prompts(RecallTask(n=[3], gaps=[0], lengths=[20], trials=2), tokenizer, 128).values()))
    got = attention.recall_allocation(model, prompts)
    with torch.no_grad():
        question = np.zeros(2)
        for p in prompts:
            with capture(model) as cap:
                model(torch.tensor([p.ids]))
            for i, (layer, (x, cos, sin)) in enumerate(zip(model.layers, cap["inputs"])):
                rows = attention_map(layer.attn, x, cos, sin)[0, :, [s - 1 for s, _ in p.answers]].mean(0).double()
                question[i] += float(rows[:, p.question :].sum()) / (len(p.answers) * len(prompts))
    answer, noise = np.array(got["answer"]), np.array(got["noise"])
    assert np.isfinite(answer).all() and np.allclose(answer + noise + question, 1.0, atol=1e-5)


def tiny_run(folder, arch: str, tok):
    """A run directory holding a tiny random model at step 0 and the tokenizer (what `diffllm import` writes)."""
    model, run = tiny(arch, tok), Run(folder)
    run.write_weights(
        model.state_dict(), {"step": 0, "tokens": 0, "world_size": 1, "zero_stage": 0, "model": asdict(model.cfg)}
    )
    run.write_tokenizer(tok.tk.to_str())
    run.write_config({"model": asdict(model.cfg), "data": {"tokenizer": {"eos_token": tok.eos_token}}})
    return model


def test_command_writes_the_recall_table_and_refuses_bad_input(tokenizer, tmp_path, capsys):
    model = tiny_run(tmp_path / "run", "diff", tokenizer)
    out = tmp_path / "eval"
    attention.main(
        [f"run={tmp_path / 'run'}", "task=recall", "n=[2,3]", "gaps=[0,4]", "length=24", "trials=2", f"out={out}"]
    )
    res = json.loads((out / "attention-recall.json").read_text())
    assert [(c["n"], c["gap"], c["queries"]) for c in res["cells"]] == [(2, 0, 4), (2, 4, 4), (3, 0, 6), (3, 4, 6)]
    assert res["task"] == "recall" and res["length"] == 24 and len(res["lambda"]) == 2
    prompts = task_prompts(RecallTask(n=[3], gaps=[4], lengths=[24], trials=2), tokenizer, 128)[(3, 4, 24)]
    want = attention.recall_allocation(model, prompts)  # eval recall's prompts, the same seed
    assert res["cells"][3]["answer"] == pytest.approx(want["answer"], abs=1e-6)
    table = (out / "attention-recall.md").read_text()
    assert table.startswith("| N | gap | layer | attention to answer | attention noise |")
    assert f"| 3 | 4 | layer 1 | {want['answer'][1]:.3g} |" in table and table in capsys.readouterr().out
    assert not (out / "attention.json").exists()  # the needle mode's file (what eval compare reads) is left alone
    for bad, message in [
        (["length=20"], "length=20: cannot hold 2 pairs, 2 queries and gap=16 (needs 4N + gap"),
        (["length=200"], "length=200: 200 words are"),
        (["task=mqar"], "task='mqar': expected one of ('needle', 'recall')"),
    ]:
        with pytest.raises(SystemExit):
            attention.main([f"run={tmp_path / 'run'}", "task=recall"] + bad)
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
