"""The study scripts (scripts/sweep_compare.py, scripts/sweep_stability.py) on collected tables written by hand: the
paired differences, spreads and rankings of sweep_compare and the divergence, spike and lambda columns of
sweep_stability, against values counted here."""
from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

from diffllm.results import RunRecord, to_csv

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(arch: str, seed: int, loss: float, lr: float, tokens: int = 1536000, **fields) -> RunRecord:
    return RunRecord(run_dir=f"/runs/{arch}/{tokens}/{lr}/seed{seed}", model=f"{arch}-micro-1", arch=arch, seed=seed,
                     total_params=1, nonembedding_params=1, block_params=1, tokens=tokens, flops=1.0,
                     final_train_loss=loss, final_val_loss=loss, wall_time_s=1.0, world_size=1, status="finished",
                     axes={"optim.lr": lr}, **fields)


def write(path: Path, records: list[RunRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_csv(records))
    return path


def test_sweep_compare_pairs_by_seed_and_ranks(tmp_path, capsys):
    # a: transformer 3.0 / 3.2, diff 3.1 / 3.1 (diff2 only in a: not shared); b: transformer 2.9 / 3.0, diff 3.2 / 3.0
    a = write(tmp_path / "a" / "runs.csv", [record("transformer", 1, 3.0, 0.01), record("transformer", 2, 3.2, 0.01),
                                           record("diff", 1, 3.1, 0.01), record("diff", 2, 3.1, 0.01),
                                           record("diff2", 1, 2.0, 0.01)])
    b = write(tmp_path / "b" / "runs.csv", [record("transformer", 1, 2.9, 0.01), record("transformer", 2, 3.0, 0.01),
                                           record("diff", 1, 3.2, 0.01), record("diff", 2, 3.0, 0.01)])
    load("sweep_compare").main([f"a={a}", f"b={b}"])
    out = capsys.readouterr().out
    # transformer: a mean 3.1, spread 0.2; b mean 2.95, spread 0.1; a - b = +0.1, +0.2 -> +0.15 [+0.1..+0.2]
    assert "| transformer | micro-1 | 1,536,000 | 2 | 3.1000 | 0.2000 | 2.9500 | 0.1000 | +0.1500 [+0.1000..+0.2000] |" \
        in out
    # diff: a 3.1 / 3.1, b 3.2 / 3.0 -> differences -0.1 and +0.1
    assert "| diff | micro-1 | 1,536,000 | 2 | 3.1000 | 0.0000 | 3.1000 | 0.2000 | +0.0000 [-0.1000..+0.1000] |" in out
    assert "diff2" not in out  # trained by a only


def test_sweep_compare_ranking_changes(tmp_path, capsys):
    a = write(tmp_path / "a" / "runs.csv", [record("transformer", 1, 3.0, 0.01), record("diff", 1, 3.1, 0.01)])
    b = write(tmp_path / "b" / "runs.csv", [record("transformer", 1, 3.3, 0.01), record("diff", 1, 3.2, 0.01)])
    load("sweep_compare").main([f"a={a}", f"b={b}"])
    out = capsys.readouterr().out
    assert "| micro-1 | 1,536,000 | transformer < diff | diff < transformer | no |" in out


def test_sweep_compare_takes_each_series_at_its_selected_lr(tmp_path, capsys):
    # a's transformer was trained at two lrs: the better one (2.5 at 0.02) is the one compared
    a = write(tmp_path / "a" / "runs.csv", [record("transformer", 1, 3.0, 0.01), record("transformer", 1, 2.5, 0.02)])
    b = write(tmp_path / "b" / "runs.csv", [record("transformer", 1, 2.6, 0.02)])
    load("sweep_compare").main([f"a={a}", f"b={b}"])
    assert "-0.1000 [-0.1000..-0.1000]" in capsys.readouterr().out


def test_sweep_compare_refuses_a_missing_side(tmp_path):
    a = write(tmp_path / "a" / "runs.csv", [record("transformer", 1, 3.0, 0.01)])
    with pytest.raises(SystemExit, match="does not exist"):
        load("sweep_compare").main([f"a={a}", f"b={tmp_path / 'nope'}"])


def test_sweep_stability_counts(tmp_path, capsys):
    nan = float("nan")
    runs = [  # transformer at 1x and 2x lr; at 2x one run is non-finite and one ends above its unigram baseline
        record("transformer", 1, 3.0, 0.01, unigram_loss=5.0, spikes=0, max_grad_norm=1.5),
        record("transformer", 2, 3.2, 0.01, unigram_loss=5.0, spikes=2, max_grad_norm=2.5),
        record("transformer", 1, nan, 0.02, unigram_loss=5.0, spikes=9, max_grad_norm=90.0),
        record("transformer", 2, 5.5, 0.02, unigram_loss=5.0, spikes=4, max_grad_norm=30.0),
        record("transformer", 3, 3.4, 0.02, unigram_loss=5.0, spikes=1, max_grad_norm=3.0),
        record("diff", 1, 3.1, 0.01, unigram_loss=5.0, lambda_lowest=0.2),
        record("diff", 2, 3.3, 0.01, unigram_loss=5.0, lambda_lowest=-0.4),
    ]
    path = write(tmp_path / "stab" / "runs.csv", runs)
    load("sweep_stability").main([f"sweep_dir={path}"])
    lines = capsys.readouterr().out.splitlines()
    row = {tuple(c.strip() for c in line.split("|")[1:4]): [c.strip() for c in line.split("|")[1:-1]]
           for line in lines if line.startswith("| ") and "micro-1" in line}
    t1, t2, d1 = row[("transformer", "micro-1", "0.01")], row[("transformer", "micro-1", "0.02")], \
        row[("diff", "micro-1", "0.01")]
    assert t1[3:6] == ["1", "2", "0"] and t1[6] == "3.1000 [3.0000..3.2000]" and t1[7] == "1 [0..2]"
    assert t2[3:6] == ["2", "3", "2"] and t2[6] == "3.4000 [3.4000..3.4000]" and t2[8] == "30 [3..90]"
    assert d1[11:13] == ["-0.400", "1"] and t1[11:13] == ["-", "-"]


def test_recall_study_takes_the_lr_with_every_seed_and_pairs_by_seed():
    """scripts/recall_study.py: per series and size, the runs at the lr holding the most seeds (phase 2's), the mean
    accuracy with its 95% t-interval, the seeds >= 0.9, the steps to 0.5 (median over those that got there) and the
    seed-paired difference to the Transformer, against values computed here."""
    study = load("recall_study")
    t_accs, d_accs = [0.5, 0.6, 0.7], [0.9, 0.6, 0.95]
    records = [record("transformer", s, 2.0, 0.006, recall_acc=a, recall_step_50=100 * s if a >= 0.5 else None)
               for s, a in zip((1, 2, 3), t_accs)]
    records += [record("transformer", 1, 2.0, 0.012, recall_acc=0.99)]  # phase 1's other lr: one seed, not chosen
    records += [record("diff", s, 2.0, 0.003, recall_acc=a) for s, a in zip((1, 2, 3), d_accs)]
    chosen = study.chosen_runs(records)
    assert {k: [r.seed for r in rs] for k, rs in chosen.items()} == {("transformer", "micro-1"): [1, 2, 3],
                                                                      ("diff", "micro-1"): [1, 2, 3]}
    assert all(r.axes["optim.lr"] == 0.006 for r in chosen[("transformer", "micro-1")])
    lines = study.main_table(chosen)
    row = next(line for line in lines if line.startswith("| diff |"))
    diffs = [d - t for d, t in zip(d_accs, t_accs)]  # 0.4, 0.0, 0.25
    half = 4.303 * statistics.stdev(diffs) / 3 ** 0.5
    mean = sum(diffs) / 3
    assert f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] (n=3)" in row and "| 2/3 |" in row
    t_row = next(line for line in lines if line.startswith("| transformer |"))
    assert "| 0.006 | 3 | 0.600 [" in t_row and "| 0/3 |" in t_row and "| 200 (3/3) |" in t_row
