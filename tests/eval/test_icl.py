"""eval icl: the label scores equal a float64 token-by-token sum of log-probabilities; the reported accuracies equal a
hand count over the same prompts; the tasks read from local files (JSONL, parquet, save_to_disk with a ClassLabel);
the synthetic task's labels are drawn per prompt; a prompt that does not fit is one line naming k and the lengths,
found before the weights are read."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from diffllm.eval import icl
from diffllm.eval.icl_tasks import SYNTHETIC_LABELS, load_task, synthetic
from tests.distributed import cli_here

ROWS = [
    {"text": "the ship sails at dawn", "label": "sea"},
    {"text": "a horse in the field", "label": "land"},
    {"text": "waves on the shore", "label": "sea"},
    {"text": "the road to the king's house", "label": "land"},
    {"text": "a storm over the water", "label": "sea"},
    {"text": "a garden behind the wall", "label": "land"},
    {"text": "fish and salt", "label": "sea"},
    {"text": "bread and stone", "label": "land"},
]


def jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reference_score(model, prompt: list[int], label: list[int]) -> float:
    """sum over the label's tokens of log p(token | prompt + the label tokens before it), the model run in float64
    on each prefix."""
    total = 0.0
    with torch.no_grad():
        for t in range(len(label)):
            logp = model(torch.tensor([prompt + label[:t]]))[0, -1].log_softmax(-1)
            total += float(logp[label[t]])
    return total


def test_label_scores_equal_a_float64_sum_of_token_log_probabilities(loaded):
    """Prompts of different lengths (right-padded in one batch, a batch split across a prompt's labels), labels of
    one and several tokens: every score equals the float64 loop within 1e-10."""
    cfg, model, tok = loaded("diff")
    p = icl.tokenize(synthetic(3, seed=1), tok, icl.IclConfig.template, 3)
    prompts = [p.ids(i, list(range(k))) for i, k in enumerate([0, 2, 3])]
    labels = p.labels + [tok.encode(" the question of the day")]
    assert len({len(x) for x in labels}) > 1 and len({len(x) for x in prompts}) == 3
    m = model.double()
    try:
        got = icl.label_scores(m, prompts, labels, batch_size=5)
        want = np.array([[reference_score(m, x, y) for y in labels] for x in prompts])
    finally:
        model.float()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_accuracy_equals_a_hand_count(runs, loaded, tmp_path):
    """A JSONL task, k=0 and k=3 in 3 orders: each order's accuracy, their mean, std, min and max equal a count of
    correct argmax labels over prompts built by hand from the task's text (template filled, demonstrations in that
    order, each tokenized on its own)."""
    task_file = jsonl(tmp_path / "seaorland.jsonl")
    c = icl.IclConfig(str(runs("diff")), task=str(task_file), k=[0, 3], permutations=3, queries=4, seq_len=128, seed=5)
    res = icl.run_icl(dataclasses.replace(c, bootstrap=200, out=str(tmp_path / "out")))
    _, model, tok = loaded("diff")
    task = load_task(str(task_file), "text", "label", None, 4, 5)
    assert task.labels == ["land", "sea"] and res["labels"] == ["land", "sea"]
    template = icl.IclConfig.template
    for k in (0, 3):
        accs = []
        for o in range(3):
            hits = 0
            for i, e in enumerate(task.episodes):
                order = icl.orders(i, k, 3, 5)[o] if k > 1 else list(range(k))
                ids = [tok.eos_id]
                for j in order:
                    text, y = e.demos[j]
                    ids += tok.encode(f"Input: {text}\nLabel: {task.labels[y]}\n")
                ids += tok.encode(f"Input: {e.query[0]}\nLabel:")
                scores = icl.label_scores(model, [ids], [tok.encode(" land"), tok.encode(" sea")], 8)[0]
                hits += int(scores.argmax() == e.query[1])
            accs.append(hits / 4)
        r = res["by_k"][k]
        assert [b["accuracy"] for b in r["by_order"]] == accs
        assert r["accuracy"] == pytest.approx(np.mean(accs)) and (r["min"], r["max"]) == (min(accs), max(accs))
        assert r["std"] == pytest.approx(np.std(accs, ddof=1) if k > 1 else 0.0)
        assert r["interval"][0] <= r["accuracy"] <= r["interval"][1]
    assert template == r"Input: {text}\nLabel: {label}\n"  # as a command line writes it: \n is read as a newline
    saved = json.loads((tmp_path / "out" / "icl-seaorland.json").read_text())
    assert saved["by_k"]["3"]["accuracy"] == res["by_k"][3]["accuracy"]


def test_k_max_is_the_largest_k_that_fits(loaded):
    _, _, tok = loaded("diff")
    task = synthetic(5, seed=2)
    p = icl.tokenize(task, tok, icl.IclConfig.template, 0)
    most = icl.fit_max(p, task, 100)
    assert all(p.length(i, most) <= 100 for i in range(5))
    assert any(p.length(i, most + 1) > 100 for i in range(5))
    icl.check_fits(p, task, most, 100)
    with pytest.raises(icl.EvalError, match=f"k={most + 1}: the prompt of query"):
        icl.check_fits(p, task, most + 1, 100)


def test_synthetic_labels_are_drawn_per_prompt():
    """Within a prompt a word keeps its label (demonstrations and query agree); across prompts the same word gets
    both labels, so no weight can know the answer."""
    task = synthetic(40, seed=0, max_demos=64)
    seen: dict[str, set] = {}
    for e in task.episodes:
        mapping = {}
        for w, y in e.demos + [e.query]:
            assert mapping.setdefault(w, y) == y
        for w, y in mapping.items():
            seen.setdefault(w, set()).add(y)
        assert set(mapping.values()) == {0, 1} and task.labels == list(SYNTHETIC_LABELS)
    assert sum(len(labels) == 2 for labels in seen.values()) >= 5


def test_tasks_from_parquet_and_save_to_disk_read_classlabel_names(tmp_path):
    import datasets

    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["land", "sea"])})
    rows = {"text": [r["text"] for r in ROWS], "label": [int(r["label"] == "sea") for r in ROWS]}
    ds = datasets.Dataset.from_dict(rows, features=feats)
    ds.to_parquet(str(tmp_path / "t.parquet"))
    datasets.DatasetDict({"train": ds.select(range(6)), "test": ds.select(range(6, 8))}).save_to_disk(
        str(tmp_path / "dd")
    )
    from_parquet = load_task(str(tmp_path / "t.parquet"), "text", "label", None, 3, 0)
    assert from_parquet.labels == ["land", "sea"] and len(from_parquet.episodes) == 3
    assert all(len(e.demos) == 5 for e in from_parquet.episodes)  # the other rows
    split = load_task(str(tmp_path / "dd"), "text", "label", None, 10, 0)
    assert split.labels == ["land", "sea"]
    assert sorted(e.query[0] for e in split.episodes) == sorted(rows["text"][6:])  # queries from test
    assert sorted(t for t, _ in split.episodes[0].demos) == sorted(rows["text"][:6])  # demonstrations from train
    assert load_task(str(tmp_path / "dd"), "text", "label", ["L", "S"], 2, 0).labels == ["L", "S"]


@pytest.mark.parametrize(
    "rows, kwargs, message",
    [
        ([{"text": "a", "label": 0}, {"text": "b", "label": 1}], {}, "integer labels need label_names"),
        ([{"text": "a", "y": "x"}], {}, "row 0 has no field 'label' (fields: text, y)"),
        ([{"text": "a", "label": 3}], {"label_names": ["p", "q"]}, "label 3 out of range for 2 label names"),
        ([[{"text": "a", "label": "x"}]], {}, "t.jsonl:1: not a JSON object per line"),
    ],
)
def test_bad_task_files_are_one_line(tmp_path, rows, kwargs, message):
    with pytest.raises(icl.EvalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_task(str(jsonl(tmp_path / "t.jsonl", rows)), "text", "label", kwargs.get("label_names"), 1, 0)


def test_a_prompt_that_does_not_fit_is_one_line_before_the_weights(runs, tmp_path, monkeypatch, capsys):
    from diffllm.runs import Run

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the prompts were checked")

    monkeypatch.setattr(Run, "model", no_weights)
    for argv, message in [
        (["k=[1,30]"], "k=30: the prompt of query "),
        (["k=[1,30]"], "longer than seq_len=64; pass a smaller k or k=max"),
        (["k=[-1]"], "k=-1: want a count >= 0 or max"),
        (["seq_len=4096"], "seq_len=4096: want 1 to the model's context (128)"),
        (["task=nope"], "task=nope: neither a builtin task (synthetic) nor an existing file or folder"),
        (["template=Q: {label} {text}"], "needs {text} and then {label}"),
    ]:
        with pytest.raises(SystemExit) as e:
            icl.main([f"run={runs('diff')}", "queries=4", *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_command_line_error_names_k_and_the_lengths(runs):
    got = cli_here("eval", "icl", f"run={runs('diff')}", "k=[0,50]", "queries=2")
    assert got.returncode == 2 and got.stdout == "" and len(got.stderr.splitlines()) == 1, got.stderr
    assert "k=50: the prompt of query" in got.stderr and "tokens (" in got.stderr and "seq_len=64" in got.stderr


def test_compare_draws_accuracy_by_k_from_each_runs_icl_results(tmp_path):
    """<run>/eval/icl-<task>.json is read by `eval compare` (never computed there) and drawn as accuracy by k with
    its interval, ticked at the k evaluated."""
    from diffllm.eval import compare

    def by_k(accs):
        return {str(k): {"accuracy": a, "interval": [a - 0.1, a + 0.1]} for k, a in zip([0, 1, 8], accs)}

    runs = {}
    for name, accs in (("diff", [0.5, 0.6, 0.9]), ("transformer", [0.5, 0.55, 0.7])):
        (tmp_path / name / "eval").mkdir(parents=True)
        (tmp_path / name / "eval" / "icl-synthetic.json").write_text(json.dumps({"by_k": by_k(accs)}))
        runs[str(tmp_path / name)] = accs
    results = compare.run_compare(compare.CompareConfig(runs=list(runs), evals=[], compute=False))
    fig = compare.figure(results, compare.labels(list(results)))
    (ax,) = fig.axes
    drawn = {c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers}  # errorbar containers
    assert drawn == {"diff": runs[str(tmp_path / "diff")], "transformer": runs[str(tmp_path / "transformer")]}
    assert list(ax.get_xticks()) == [0, 1, 8]
    assert (tmp_path / "compare" / "compare.png").is_file()


def test_summary_over_orders_is_a_hand_count():
    """3 orders x 4 queries of right/wrong: accuracies 2/4, 1/4, 3/4 -> mean 0.5, std 0.25 (n-1), min 0.25, max
    0.75; the mean's interval resamples queries (each counted by its share of correct orders)."""
    correct = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=bool)
    r = icl.summarise(correct, bootstrap=500, level=0.9, seed=0)
    assert [b["accuracy"] for b in r["by_order"]] == [0.5, 0.25, 0.75]
    assert (r["accuracy"], r["min"], r["max"]) == (0.5, 0.25, 0.75) and r["std"] == pytest.approx(0.25)
    assert 0 <= r["interval"][0] < 0.5 < r["interval"][1] <= 1
    assert all(np.isnan(icl.summarise(correct, bootstrap=0, level=0.9, seed=0)["interval"]))
