"""`diffllm study attention` (diffllm/studies/attention.py) on run folders written by hand: the rows it names, the KV
cache per token it reports (counted here from heads and head widths), the token-weighted val loss over eval ppl's
sources, the recall accuracy of eval recall, and the seed-paired differences to MHA, against values computed here."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from diffllm.config import compose
from diffllm.results import RunRecord
from diffllm.studies.common import t_interval

from .test_studies import record, study, write


def run_folder(root: Path, model: str, seed: int, ppl: dict | None = None, recall: float | None = None) -> str:
    """A run directory holding what the study reads: config.yaml (the preset's resolved model section) and, when
    given, eval/ppl.json ({source: (loss, tokens)}) and eval/recall.json."""
    d = root / model / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    model_cfg = OmegaConf.to_container(compose("train", [f"model={model}"]).model, resolve=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"model": model_cfg}))
    if ppl:
        sources = {name: {"loss": loss, "tokens": tokens} for name, (loss, tokens) in ppl.items()}
        (d / "eval" / "ppl.json").write_text(json.dumps({"sources": sources}))
    if recall is not None:
        (d / "eval" / "recall.json").write_text(json.dumps({"mean": recall}))
    return str(d)


def rec(root: Path, model: str, seed: int, loss: float, selected: bool = True, **run) -> RunRecord:
    arch = model.split("-")[0]
    r = record(arch, seed, loss, 0.01, run_dir=run_folder(root, model, seed, **run), selected=selected)
    r.model = model
    return r


def row(text: str, attention: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {attention} |"))
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_rows_costs_means_and_seed_paired_differences(tmp_path):
    ppl = {  # seed -> (MHA loss, GQA loss), the GQA runs scored on two sources of unequal size
        1: (3.50, {"a": (3.6, 100), "b": (3.0, 300)}),
        2: (3.40, {"a": (3.3, 100), "b": (3.5, 300)}),
        3: (3.45, {"a": (3.5, 100), "b": (3.1, 300)}),
    }
    lm = []
    for seed, (mha, gqa) in ppl.items():
        lm.append(rec(tmp_path / "lm", "transformer-micro-1", seed, 9.0, ppl={"all": (mha, 1000)}))
        lm.append(rec(tmp_path / "lm", "transformer-micro-1-gqa", seed, 9.0, ppl=gqa))
        lm.append(rec(tmp_path / "lm", "diff-micro-1", seed, 3.3 + seed / 100))  # no eval: its final_val_loss
    lm.append(rec(tmp_path / "lm", "diff-micro-1", 9, 1.0, selected=False))  # a tuning run: not reported
    accs = {1: (0.2, 0.5), 2: (0.1, 0.3), 3: (0.3, 0.35)}
    recall_runs = [
        rec(tmp_path / "rec", model, seed, 9.0, recall=acc)
        for seed, pair in accs.items()
        for model, acc in zip(["transformer-micro-1", "diff-micro-1"], pair)
    ]
    code, out, err = study(
        "attention",
        f"lm={write(tmp_path / 'lm.csv', lm)}",
        f"recall={write(tmp_path / 'rec.csv', recall_runs)}",
        f"out={tmp_path / 'out'}",
    )
    assert code == 0, err
    assert (tmp_path / "out" / "attention.md").read_text() == out
    mha, gqa, diff = row(out, "mha"), row(out, "transformer-gqa"), row(out, "diff")
    assert [mha[1], gqa[1], diff[1]] == ["micro-1"] * 3  # the -gqa preset lines up with its size

    cfg = compose("train", ["model=transformer-micro-1"]).model
    head_dim = cfg.d_model // cfg.n_heads
    # K and V, every layer, bf16: MHA caches n_heads heads, the -gqa preset its n_kv_heads
    gqa_heads = compose("train", ["model=transformer-micro-1-gqa"]).model.n_kv_heads
    assert mha[3] == f"{cfg.n_layers * 2 * cfg.n_heads * head_dim * 2:,}"
    assert gqa[3] == f"{cfg.n_layers * 2 * gqa_heads * head_dim * 2:,}"
    assert gqa[4] == f"{gqa_heads / cfg.n_heads:.2f}" and mha[4] == "1.00"

    def ci(xs):
        m, lo, hi = t_interval(xs)
        return f"{m:.4f} [{lo:.4f}, {hi:.4f}]"

    # eval ppl's sources, weighted by their tokens
    gqa_loss = {
        s: sum(loss * n for loss, n in v[1].values()) / sum(n for _, n in v[1].values()) for s, v in ppl.items()
    }
    assert gqa[6] == ci(list(gqa_loss.values()))
    assert gqa[7] == ci([gqa_loss[s] - ppl[s][0] for s in ppl]) + " (n=3)"
    assert diff[6] == ci([3.31, 3.32, 3.33])  # no eval/ppl.json: final_val_loss, and seed 9 (not selected) left out
    assert diff[10] == ci([accs[s][1] - accs[s][0] for s in accs]) + " (n=3)"
    assert mha[9] == ci([a for a, _ in accs.values()]) and mha[10] == "-"
    assert gqa[8:] == ["-", "-", "-"]  # no recall runs for it


def test_a_sweep_without_reported_runs_is_one_line(tmp_path):
    lm = [rec(tmp_path / "lm", "transformer-micro-1", 1, 3.0, selected=False)]
    code, _, err = study("attention", f"lm={write(tmp_path / 'lm.csv', lm)}")
    assert code == 2 and err.count("\n") == 1 and "lm=" in err and "no reported run" in err, err
