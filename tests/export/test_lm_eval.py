"""lm-evaluation-harness through the export path: `HFLM` on an exported model scores a local multiple-choice task with
the log-likelihoods our own model gives (computed here the way lm-eval splits context and continuation)."""

from __future__ import annotations

import json

import pytest
import torch

from diffllm.export.hf import export_run
from diffllm.runs import Run

transformers = pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")

DOCS = [
    {
        "question": "ROMEO: But soft, what light through yonder window",
        "choices": ["breaks", "sleeps", "sings"],
        "answer": 0,
    },
    {"question": "JULIET: O Romeo, Romeo! wherefore art thou", "choices": ["Romeo", "here", "gone"], "answer": 0},
    {"question": "HAMLET: To be, or not to", "choices": ["be", "go", "sing"], "answer": 0},
    {"question": "KING LEAR: Nothing will come of", "choices": ["nothing", "gold", "love"], "answer": 0},
]
TASK = """task: diffllm_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def our_loglikelihood(model, tok, context: str, continuation: str) -> float:
    whole, ctx = tok.encode(context + continuation), tok.encode(context)
    cont = whole[len(ctx) :]
    with torch.no_grad():
        logp = model(torch.tensor([whole]))[0].double().log_softmax(-1)  # (T, V)
    return sum(logp[len(whole) - len(cont) - 1 + i, t].item() for i, t in enumerate(cont))


@pytest.mark.slow
def test_hflm_scores_equal_our_model(runs, tmp_path, monkeypatch):
    """On the remote-code export (native classes are transformers' own models, which lm-eval knows)."""
    layout = "diff-layernorm-partial"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    done = export_run(runs[layout], tmp_path / "hf")
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mc.yaml").write_text(TASK.format(data=data))
    remote = done.format == "remote"
    lm = HFLM(
        pretrained=transformers.AutoModelForCausalLM.from_pretrained(done.out, trust_remote_code=remote),
        tokenizer=transformers.AutoTokenizer.from_pretrained(done.out),
        batch_size=4,
        device="cpu",
    )
    tasks = TaskManager(include_path=str(tmp_path / "tasks"))
    out = simple_evaluate(model=lm, tasks=["diffllm_local_mc"], task_manager=tasks, log_samples=True)
    _, ours, tok = Run(runs[layout]).model()
    correct = 0
    for sample in out["samples"]["diffllm_local_mc"]:
        doc = sample["doc"]
        want = [our_loglikelihood(ours, tok, doc["question"], " " + c) for c in doc["choices"]]  # target_delimiter " "
        got = [r[0] for r in sample["filtered_resps"]]
        assert max(abs(a - float(b)) for a, b in zip(want, got)) <= 1e-4, (want, got)
        correct += max(range(len(want)), key=want.__getitem__) == doc["answer"]
    assert out["results"]["diffllm_local_mc"]["acc,none"] == pytest.approx(correct / len(DOCS))
