"""`sweep collect` axes: the config keys that differ within a (model, tokens) group become columns (bookkeeping left
out), round-trip through runs.csv, and show by short label in runs.md; on two real tiny runs as well."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from diffllm.results import RunRecord, find_axes, flatten, metrics_stats, read_csv, read_run, to_csv
from diffllm.scaling.baselines import BIGRAM_K
from diffllm.sweep.collect import to_markdown
from tests.scaling.synthetic import hand_baselines


def test_flatten_and_axes_leave_bookkeeping_out():
    a = {
        "optim": {"lr": 0.002, "betas": [0.9, 0.95]},
        "seed": 1,
        "run_dir": "/s/a",
        "data": {"seed": 1, "sources": [{"path": "/x/a.txt"}], "tokenizer": {"path": "/s/a/tokenizer.json"}},
        "model": {"lambda_init": None},
        "trainer": {"resume": "auto"},
        "logging": {"name": "a"},
    }
    b = {
        "optim": {"lr": 0.004, "betas": [0.9, 0.95]},
        "seed": 2,
        "run_dir": "/s/b",
        "data": {"seed": 2, "sources": [{"path": "/y/a.txt"}], "tokenizer": {"path": "/s/b/tokenizer.json"}},
        "model": {"lambda_init": 0.8},
        "trainer": {"resume": "/s/b/checkpoints/step8"},
        "logging": {"name": "b"},
    }
    assert flatten(a)["optim.betas"] == (0.9, 0.95) and flatten(a)["data.sources.0.path"] == "/x/a.txt"
    assert find_axes({("m", 1): [flatten(a), flatten(b)]}) == ["model.lambda_init", "optim.lr"]
    c = {**a, "optim": {"lr": 0.002, "betas": [0.9, 0.99]}}  # another group: betas differ there only
    assert find_axes({("m", 1): [flatten(a), flatten(b)], ("n", 1): [flatten(a), flatten(c)]}) == [
        "model.lambda_init",
        "optim.betas",
        "optim.lr",
    ]
    newer = {**b, "trainer": {"resume": "auto", "eval": {"every": 0}}}  # saved by a diffllm that has trainer.eval
    assert find_axes({("m", 1): [flatten(a), flatten(newer)]}) == ["model.lambda_init", "optim.lr"]


def _record(run_dir: str, **axes) -> RunRecord:
    return RunRecord(
        run_dir,
        "diff-micro-1",
        "diff",
        1,
        10,
        8,
        6,
        640,
        1.0,
        5.0,
        5.1,
        2.0,
        1,
        "finished",
        6.0,
        5.2,
        False,
        True,
        axes=axes,
    )


def test_axis_columns_round_trip(tmp_path):
    records = [
        _record(
            "/r/a",
            **{
                "optim.lr": 0.002,
                "model.lambda_init": None,
                "optim.betas": (0.9, 0.95),
                "optim.schedule": "cosine",
                "trainer.compile": True,
            },
        ),
        _record(
            "/r/b",
            **{
                "optim.lr": 1e-05,
                "model.lambda_init": 0.8,
                "optim.betas": (0.9, 0.99),
                "optim.schedule": "wsd",
                "trainer.compile": False,
            },
        ),
    ]
    text = to_csv(records)
    assert text.splitlines()[0].endswith(
        "selected,lambda_min,lambda_lowest,spikes,skipped_steps,max_grad_norm,"
        "act_max,attn_logit_max,recall_acc,recall_step_50,recall_step_90,branch_parent,branch_tokens,"
        "branch_wall_s,kn3_loss,kn4_loss,model.lambda_init,optim.betas,optim.lr,"
        "optim.schedule,trainer.compile"
    )
    (tmp_path / "runs.csv").write_text(text)
    assert read_csv(tmp_path / "runs.csv") == records
    md = to_markdown(records, select=None)
    assert "| model | arch | seed | λ_init | betas | lr | schedule | compile |" in md
    assert "| diff-micro-1 | diff | 1 | formula | (0.9, 0.95) | 0.002 | cosine | True |" in md


@pytest.mark.slow
def test_two_real_tiny_runs(tmp_path):
    """Two real 8-step runs at two learning rates: collect finds the one axis, computes the baselines from the
    Shakespeare windows the trainer read (checked against the trainer's own loader here) and selects the better lr."""
    from diffllm.config import build
    from diffllm.data import DataConfig, build_train_loader
    from diffllm.data.loader import held_out_windows
    from diffllm.runs import Run
    from diffllm.sweep.collect import collect
    from tests.distributed import train_side_by_side

    def overrides(lr: float) -> list[str]:
        run = tmp_path / "transformer-micro-1" / "16K" / f"lr={lr:g}" / "seed1"
        return [
            "model=transformer-micro-1",
            "trainer.tokens=16384",
            f"run_dir='{run}'",
            "data.tokenizer.vocab_size=1024",
            "data.seq_len=128",
            "trainer.global_batch_tokens=2048",
            "trainer.micro_batch_size=16",
            "trainer.zero_stage=0",
            "trainer.val_batches=4",
            "trainer.val_tokens=4096",  # the final validation: a share of the held-out plays, for speed
            "trainer.save_every_steps=0",
            "optim.warmup_steps=2",
            f"optim.lr={lr}",
            "logging.wandb=disabled",
            "seed=1",
            "data.seed=1",
        ]

    train_side_by_side({f"lr={lr:g}": overrides(lr) for lr in (0.002, 0.008)}, tmp_path / "logs")
    records = collect(tmp_path)
    assert [r.axes for r in records] == [{"optim.lr": 0.002}, {"optim.lr": 0.008}]
    best = min(records, key=lambda r: r.final_val_loss)
    assert [r.selected for r in records] == [r is best for r in records]
    run = Run(records[0].run_dir)
    data, tok = build(DataConfig, run.config()["data"], "data"), run.tokenizer()
    loader = build_train_loader(data, tok, 0, 1, 16)
    train = np.concatenate([next(loader).tokens.numpy() for _ in range(8)])
    loader.close()
    val = np.stack([w[0] for ws in held_out_windows(data, tok, 4096).values() for w in ws])  # trainer.val_tokens
    uni, bi = hand_baselines(train.tolist(), val.tolist(), tok.vocab_size, BIGRAM_K)
    assert (records[0].unigram_loss, records[0].bigram_loss) == pytest.approx((uni, bi), rel=1e-12)
    assert records[1].bigram_loss == records[0].bigram_loss  # same data, tokens and seed: one cache entry
    assert len(list((tmp_path / ".baselines").glob("*.json"))) == 1
    assert "| transformer-micro-1 | transformer | 1 | 0.002 |" in to_markdown(records, tmp_path)
    assert Path(records[0].run_dir).name == "seed1"


def test_metrics_columns_come_from_the_diagnostics(tmp_path):
    """lambda_min: the last record's; lambda_lowest: the lowest of any record; act_max / attn_logit_max: the largest
    of any layer in any record (a line cut short by a kill is skipped); none for values no record carries."""
    diff = tmp_path / "diff"
    diff.mkdir()
    records = [
        {
            "step": 25,
            "loss": 5.0,
            "lambda_min": 0.31,
            "act_max/0": 3.0,
            "act_max/1": 7.5,
            "attn_logit_max/0": 2.0,
            "attn_logit_max/1": 1.0,
        },
        {"step": 25, "val_loss": 5.1},
        {"step": 50, "loss": 4.0, "lambda_min": -0.12, "act_max/0": 6.0, "act_max/1": 4.0},
        {"step": 75, "loss": 3.5, "lambda_min": 0.05, "attn_logit_max/0": 9.25, "attn_logit_max/1": 0.5},
    ]
    (diff / "metrics.jsonl").write_text(
        "\n".join(map(json.dumps, records)) + '\n{"step": 100, "act_max/0": 99.0, "lamb'
    )
    assert metrics_stats(diff) == {
        "lambda_min": 0.05,
        "lambda_lowest": -0.12,
        "act_max": 7.5,
        "attn_logit_max": 9.25,
        "recall_acc": None,
        "recall_step_50": None,
        "recall_step_90": None,
    }
    plain = tmp_path / "transformer"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text(json.dumps({"step": 25, "loss": 5.0}) + "\n")
    nothing = dict.fromkeys(
        ("lambda_min", "lambda_lowest", "act_max", "attn_logit_max", "recall_acc", "recall_step_50", "recall_step_90")
    )
    assert metrics_stats(plain) == nothing == metrics_stats(tmp_path / "missing")


def test_stability_columns_come_from_the_summary_and_round_trip(tmp_path):
    """spikes, skipped_steps, max_grad_norm: summary.json's (the trainer's spike detection); none for an older run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(
        json.dumps(
            {
                "model": "diff-micro-1",
                "arch": "diff",
                "spikes": 3,
                "skipped_steps": 2,
                "max_grad_norm": 893.14,
                "status": "finished",
            }
        )
    )
    record = read_run(run)
    assert (record.spikes, record.skipped_steps, record.max_grad_norm) == (3, 2, 893.14)
    (tmp_path / "runs.csv").write_text(to_csv([record, _record("/r/old")]))
    assert read_csv(tmp_path / "runs.csv") == [record, _record("/r/old")]
    assert _record("/r/old").spikes is None


def test_recall_columns_come_from_the_in_loop_evaluation(tmp_path):
    """recall_acc: the last eval/recall/acc; recall_step_50 / _90: the first evaluated step at or above 0.5 / 0.9
    (a dip after it does not move it); shown in runs.md only when some run has them."""
    run = tmp_path / "recall"
    run.mkdir()
    curve = [(100, 0.2), (200, 0.5), (300, 0.45), (400, 0.88), (500, 0.93), (600, 0.91)]
    lines = [{"step": s, "loss": 1.0} for s in (100, 200)] + [{"step": s, "eval/recall/acc": a} for s, a in curve]
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    stats = metrics_stats(run)
    assert (stats["recall_acc"], stats["recall_step_50"], stats["recall_step_90"]) == (0.91, 200, 500)
    never = tmp_path / "never"
    never.mkdir()
    (never / "metrics.jsonl").write_text(json.dumps({"step": 100, "eval/recall/acc": 0.3}) + "\n")
    assert [metrics_stats(never)[k] for k in ("recall_acc", "recall_step_50", "recall_step_90")] == [0.3, None, None]
    records = [read_run(run), read_run(never)]
    table = to_markdown(records, tmp_path, select=None)
    assert "| recall_acc | recall_step_50 | recall_step_90 | wall_time_s |" in table
    assert "| 0.9100 | 200 | 500 |" in table and "| 0.3000 | - | - |" in table
    assert "recall_acc" not in to_markdown([read_run(tmp_path / "missing")], tmp_path, select=None)
    (tmp_path / "runs.csv").write_text(to_csv(records))
    assert [r.recall_step_90 for r in read_csv(tmp_path / "runs.csv")] == [500, None]
