"""eval recall: the prompts are the held-out documents tokenized as the packer does; the accuracy equals a hand count
for a fake model whose greedy predictions are known (right exactly on the queries of chosen keys); the bootstrap
interval equals a direct resampling loop and, with one query per prompt, the binomial quantiles it estimates; a tiny
run trained on the task with answer-only loss logs the in-loop curve, which equals the scorer on its checkpoint."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from diffllm.data.needle import KEYS
from diffllm.data.recall import heldout
from diffllm.eval.recall import RecallTask, bootstrap_interval, recall_accuracy, recall_table, task_prompts

RIGHT = set(KEYS[:16])  # the fake model answers the queries of these keys and no other


class KnownAnswers(torch.nn.Module):
    """A fake model with known greedy predictions: on a prompt it was given, the argmax at every position is the true
    next token inside the answers of RIGHT keys' queries, and a wrong token (the true one + 1) everywhere else."""

    def __init__(self, prompts: list, tok, vocab: int, max_seq_len: int = 256):
        super().__init__()
        self.cfg, self.vocab, self.targets = SimpleNamespace(max_seq_len=max_seq_len), vocab, []
        for p in prompts:
            ids = torch.tensor(p.ids)
            want = (ids[1:] + 1) % vocab  # (L-1,): wrong everywhere ...
            for s, e in p.answers:
                key = tok.decode(p.ids[:s]).split()[-1]  # the word just before the answer is the queried key
                if key in RIGHT:  # ... but inside these answers
                    want[s - 1 : e - 1] = ids[s:e]
            self.targets.append((ids[:-1], want))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        out = torch.zeros(*ids.shape, self.vocab)
        for b, row in enumerate(ids):
            inp, want = next((i, w) for i, w in self.targets if torch.equal(row[: len(i)], i))
            out[b, torch.arange(len(want)), want] = 1.0
        return out


def test_prompts_are_held_out_documents_tokenized_like_the_packer(tokenizer):
    task = RecallTask(n=[2, 5], gaps=[0, 7], lengths=[32, 48], trials=6)
    for (n, gap, length), prompts in task_prompts(task, tokenizer, 256).items():
        for p in prompts:
            assert p.ids[0] == tokenizer.eos_id and len(p.answers) == n
            words = tokenizer.decode(p.ids[1:]).split()
            assert len(words) == length and tokenizer.encode(" " + " ".join(words)) == p.ids[1:]
            pairs = {w: words[i + 1] for i, w in enumerate(words[: length - 2 * n]) if w in KEYS}
            assert len(pairs) == n
            assert heldout(list(pairs), list(pairs.values()))  # a held-out binding set
            for s, e in p.answers:
                key = tokenizer.decode(p.ids[:s]).split()[-1]
                assert tokenizer.decode(p.ids[s:e]).strip() == pairs[key]
            assert words[length - 2 * n - gap - 1] in pairs.values()  # the last value, then `gap` words, the queries


def test_accuracy_equals_a_hand_count(tokenizer):
    task = RecallTask(n=[2, 4], gaps=[0, 8], lengths=[40], trials=10, batch_size=3, bootstrap=200)
    cells = task_prompts(task, tokenizer, 256)
    model = KnownAnswers([p for ps in cells.values() for p in ps], tokenizer, tokenizer.vocab_size)
    res = recall_accuracy(model, tokenizer, task)
    hand, by_n = {}, {}
    for (n, gap, length), prompts in cells.items():
        keys = [tokenizer.decode(p.ids[:s]).split()[-1] for p in prompts for s, _ in p.answers]
        hand[(n, gap, length)] = sum(k in RIGHT for k in keys) / len(keys)
        by_n.setdefault(n, []).extend(k in RIGHT for k in keys)
    got = {(c["n"], c["gap"], c["length"]): c["accuracy"] for c in res["cells"]}
    assert got == pytest.approx(hand, abs=1e-12) and 0.2 < res["mean"] < 0.8  # both verdicts occur
    assert res["by_n"] == pytest.approx({n: np.mean(v) for n, v in by_n.items()}, abs=1e-12)
    assert all(c["lo"] <= c["accuracy"] <= c["hi"] and c["queries"] == 10 * c["n"] for c in res["cells"])
    table = recall_table(res)
    assert "| N | gap | length 40 |" in table and f"| 4 | 8 | {got[(4, 8, 40)]:.3f} [" in table


def test_bootstrap_interval_equals_direct_resampling():
    """Ratio of sums over prompts resampled with replacement: the vectorised interval equals a loop over the same
    draws; with one query per prompt its quantiles are those of Binomial(P, p)/P, computed exactly."""
    hits, counts = np.array([0, 2, 1, 4, 3]), np.array([2, 2, 4, 4, 4])
    reps, level, seed = 500, 0.9, 3
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 5, size=(reps, 5))
    stats = sorted(sum(hits[i] for i in row) / sum(counts[i] for i in row) for row in idx)
    want = [np.quantile(stats, q) for q in ((1 - level) / 2, (1 + level) / 2)]
    assert bootstrap_interval(hits, counts, reps, level, seed) == pytest.approx(want, abs=1e-12)

    p_hits = np.array([1] * 12 + [0] * 8)  # P = 20, p = 0.6
    lo, hi = bootstrap_interval(p_hits, np.ones(20), 100_000, 0.95, 0)
    cdf = np.cumsum([math.comb(20, k) * 0.6**k * 0.4 ** (20 - k) for k in range(21)])
    q_lo, q_hi = np.searchsorted(cdf, 0.025) / 20, np.searchsorted(cdf, 0.975) / 20
    assert abs(lo - q_lo) <= 0.05 + 1e-9 and abs(hi - q_hi) <= 0.05 + 1e-9 and lo < 0.6 < hi
    assert bootstrap_interval(np.ones(7), np.ones(7), 100, 0.95, 0) == (1.0, 1.0)


@pytest.mark.slow
def test_a_tiny_run_logs_the_recall_curve_and_the_command_scores_it(tmp_path):
    """data=recall, loss on the answers only, in-loop recall every 10 steps: the curve is in metrics.jsonl, the last
    point equals the scorer on the final checkpoint, and `eval recall` writes its JSON and table."""
    from diffllm.eval.recall import main
    from diffllm.runs import Run, read_metrics
    from tests.distributed import run_train

    run_dir = tmp_path / "run"
    run_train(
        [
            "model=diff-tiny",
            "data=recall",
            "model.d_model=64",
            "model.n_layers=2",
            "model.max_seq_len=128",
            "data.seq_len=128",
            "trainer.micro_batch_size=8",
            "trainer.global_batch_tokens=1024",
            "trainer.tokens=20480",
            "trainer.log_every=10",
            "trainer.val_every=0",
            "trainer.val_batches=2",
            "trainer.zero_stage=0",
            "optim.warmup_steps=2",
            "optim.lr=3e-3",
            "trainer.eval.every=10",
            "trainer.eval.recall_n=[2,4]",
            "trainer.eval.recall_gaps=[0]",
            "trainer.eval.recall_trials=4",
            f"run_dir={run_dir}",
        ],
        1,
        tmp_path / "logs",
        launcher="plain",
    )
    records = read_metrics(run_dir)
    curve = [r for r in records if "eval/recall/acc" in r]
    assert [r["step"] for r in curve] == [10, 20] and all("eval/recall/n4/acc" in r for r in curve)
    last = [r for r in records if "loss" in r][-1]
    assert 0.02 * last["tokens"] < last["loss_tokens"] < 0.15 * last["tokens"]  # ~N of each ~65-token document
    _, model, tok = Run(run_dir).model()
    from diffllm.data.needle import FILLER, VALUES

    assert all(len(tok.encode(" " + w)) == 1 for w in KEYS + VALUES + FILLER)  # data=recall's BPE: one token a word
    res = recall_accuracy(model, tok, RecallTask(n=[2, 4], gaps=[0], lengths=[64], trials=4, bootstrap=0))
    assert curve[-1]["eval/recall/acc"] == res["mean"] and curve[-1]["eval/recall/n2/acc"] == res["by_n"][2]
    main([f"run={run_dir}", "n=[2,4]", "gaps=[0,8]", "trials=4", "bootstrap=100", f"out={tmp_path / 'eval'}"])
    saved = json.loads((tmp_path / "eval" / "recall.json").read_text())
    assert len(saved["cells"]) == 4 and saved["step"] == 20
    assert (tmp_path / "eval" / "recall.md").read_text().startswith("| N | gap | length 64 |")
