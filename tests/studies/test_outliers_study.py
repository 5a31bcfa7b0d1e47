"""`diffllm study outliers` (diffllm/studies/outliers.py): from eval outliers results written by hand, the runs it takes
(best lr, largest budget), every mean, 95% t-interval and seed-paired ratio / difference against values computed
here; a run without results is a one-line error naming it and the command; and end to end on a tiny real sweep
(trained by `diffllm sweep`, evaluated by `diffllm eval outliers`), every number against the eval jsons."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffllm.cli.main import main as diffllm_main
from tests.studies.test_studies import record, study, write
from tests.train.helpers import TINY

REPO = Path(__file__).resolve().parents[2]
T975 = {1: 12.706, 2: 4.303}  # two-sided 95% t quantiles for 1 and 2 degrees of freedom


def ci(xs: list[float], digits: int) -> str:
    """mean [lo, hi] as the study prints it, computed here."""
    m = sum(xs) / len(xs)
    half = T975[len(xs) - 1] * statistics.stdev(xs) / math.sqrt(len(xs))
    return f"{m:.{digits}f} [{m - half:.{digits}f}, {m + half:.{digits}f}]"


def outliers_json(logit: float, hidden: float, losses: dict, accs: dict | None) -> dict:
    res = {"attention_logits": {"top1": logit}, "hidden_states": {"top1": hidden}, "quantised_loss": losses}
    if accs is not None:
        res["quantised_accuracy"] = accs
    return res


def put(tmp_path: Path, name: str, res: dict | None) -> str:
    run_dir = tmp_path / "runs" / name
    (run_dir / "eval").mkdir(parents=True)
    if res is not None:
        (run_dir / "eval" / "outliers.json").write_text(json.dumps(res))
    return str(run_dir)


T = [(20.0, 30.0, 3.0, 3.5, 0.30, 0.25), (24.0, 28.0, 3.2, 3.9, 0.32, 0.27), (22.0, 35.0, 3.1, 3.4, 0.28, 0.26)]
D = [(10.0, 33.0, 3.1, 3.2, 0.31, 0.30), (6.0, 21.0, 3.0, 3.1, 0.30, 0.31), (11.0, 28.0, 3.3, 3.3, 0.29, 0.29)]


def sweep_by_hand(tmp_path: Path) -> Path:
    """Transformer and Diff, seeds 1-3 at lr 0.01 (the best) and 1,536,000 tokens; a worse lr and a smaller budget
    that the study must leave out (their results would change every number)."""
    records = []
    for arch, rows in (("transformer", T), ("diff", D)):
        for seed, (logit, hidden, l32, l4, a32, a4) in enumerate(rows, start=1):
            res = outliers_json(logit, hidden, {"fp32": l32, "4": l4}, {"fp32": a32, "4": a4})
            records.append(record(arch, seed, 3.0, 0.01, run_dir=put(tmp_path, f"{arch}{seed}", res)))
        bad = outliers_json(1e3, 1e3, {"fp32": 9.0, "4": 9.0}, {"fp32": 0.0, "4": 0.0})
        records.append(record(arch, 1, 3.5, 0.02, run_dir=put(tmp_path, f"{arch}-lr", bad)))  # a worse lr
        small = record(arch, 1, 3.6, 0.01, tokens=768000, run_dir=put(tmp_path, f"{arch}-small", bad))
        records.append(small)  # the smaller budget (its own best lr)
    return write(tmp_path / "runs.csv", records)


def test_means_intervals_and_seed_paired_comparisons(tmp_path):
    code, out, err = study("outliers", f"sweep_dir={sweep_by_hand(tmp_path)}", f"out={tmp_path / 'o'}")
    assert code == 0, err
    assert (tmp_path / "o" / "outliers.md").read_text() == out
    lines = out.splitlines()
    t_row = next(x for x in lines if x.startswith("| transformer | micro-1 |"))
    assert t_row == (
        f"| transformer | micro-1 | 1,536,000 | 3 | {ci([r[0] for r in T], 2)} | {ci([r[1] for r in T], 2)} |"
    )
    ratios = [
        f"{ci([d[i] / t[i] for d, t in zip(D, T)], 3)} (n=3)" for i in (0, 1)
    ]  # logit 0.5, 0.25, 0.5; hidden 1.1, 0.75, 0.8
    assert f"| diff | micro-1 | 1,536,000 | 3 | {ratios[0]} | {ratios[1]} |" in lines
    loss = [ci([r[i] for r in D], 4) for i in (2, 3)]
    assert f"| diff | micro-1 | 1,536,000 | 3 | {loss[0]} | {loss[1]} |" in lines
    dloss = [f"{ci([d[i] - t[i] for d, t in zip(D, T)], 4)} (n=3)" for i in (2, 3)]
    assert f"| diff | micro-1 | 1,536,000 | 3 | {dloss[0]} | {dloss[1]} |" in lines
    dacc = [f"{ci([d[i] - t[i] for d, t in zip(D, T)], 3)} (n=3)" for i in (4, 5)]
    assert f"| diff | micro-1 | 1,536,000 | 3 | {dacc[0]} | {dacc[1]} |" in lines
    assert "| series | size | tokens | seeds | fp32 | 4-bit |" in lines
    assert "| series | size | tokens | seeds | fp32 - Transformer | 4-bit - Transformer |" in lines
    assert "1000.00" not in out and "9.0000" not in out and "768,000" not in out  # not the worse lr, smaller budget
    assert sum(x.startswith("| transformer |") for x in lines) == 3  # values only: no pairing with itself


def test_a_run_without_results_is_one_line_naming_it_and_the_command(tmp_path):
    good = outliers_json(20.0, 30.0, {"fp32": 3.0}, None)
    records = [
        record("transformer", 1, 3.0, 0.01, run_dir=put(tmp_path, "t1", good)),
        record("diff", 1, 3.0, 0.01, run_dir=put(tmp_path, "d1", None)),
        record("diff", 2, 3.0, 0.01, run_dir=put(tmp_path, "d2", None)),
    ]
    code, out, err = study("outliers", f"sweep_dir={write(tmp_path / 'runs.csv', records)}")
    d1 = tmp_path / "runs" / "d1"
    assert (code, out) == (2, "")
    assert err == (
        f"diffllm study outliers: error: {d1}: no eval outliers results (outliers.json in its eval/) (and 1 other "
        f"selected run(s)); run `diffllm eval outliers run={d1}` on each selected run first\n"
    )
    code, _, err = study("outliers", f"sweep_dir={tmp_path / 'nowhere'}")
    assert code == 2 and err.startswith("diffllm study outliers: error: sweep_dir=") and err.count("\n") == 1


TINY_SWEEP = {
    "name": "tiny-outliers",
    "models": ["transformer-tiny", "diff-tiny"],
    "tokens": [2048],  # two steps of 1024 tokens
    "seeds": [1, 2],
    "overrides": [a for a in TINY if not a.startswith(("trainer.tokens=", "trainer.save_every_steps="))]
    + ["trainer.zero_stage=0", "trainer.val_every=2", "optim.warmup_steps=1"],
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diffllm.cli", *args], capture_output=True, text=True, timeout=600, cwd=REPO
    )


@pytest.mark.slow  # four real runs trained, each evaluated: about a minute
def test_a_tiny_real_sweep_end_to_end(tmp_path, tokenizer):
    (tmp_path / "configs" / "sweep").mkdir(parents=True)
    (tmp_path / "configs" / "sweep" / "tiny-outliers.yaml").write_text(yaml.safe_dump(TINY_SWEEP))
    root = tmp_path / "sweep"
    done = cli("sweep", "--config-dir", str(tmp_path / "configs"), "sweep=tiny-outliers", f"sweep_dir={root}")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {(m, s): root / m / "2048" / f"seed{s}" for m in TINY_SWEEP["models"] for s in (1, 2)}

    code, out, err = study("outliers", f"sweep_dir={root}")  # in this process, as are 3 of the 4 evals below
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no eval outliers results" in err and "run `diffllm eval outliers run=" in err

    for i, run in enumerate(runs.values()):
        argv = ("eval", "outliers", f"run={run}", "tokens=128", "bits=[8,4]", "cloze_items=8")
        if i == 0:
            ev = cli(*argv)
            assert ev.returncode == 0, ev.stderr
        else:
            diffllm_main(list(argv))
    after = cli("study", "outliers", f"sweep_dir={root}", f"out={tmp_path / 'o'}")
    assert after.returncode == 0, after.stderr
    assert (tmp_path / "o" / "outliers.md").read_text() == after.stdout
    res = {k: json.loads((run / "eval" / "outliers.json").read_text()) for k, run in runs.items()}

    def values(model: str, get) -> list[float]:
        return [get(res[(model, s)]) for s in (1, 2)]

    def paired(get, op) -> str:
        return f"{ci([op(d, t) for d, t in zip(values('diff-tiny', get), values('transformer-tiny', get))], 3)} (n=2)"

    lines = after.stdout.splitlines()
    logit, hidden = (lambda r: r["attention_logits"]["top1"]), (lambda r: r["hidden_states"]["top1"])
    tops = [ci(values("diff-tiny", f), 2) for f in (logit, hidden)]
    assert f"| diff | tiny | 2,048 | 2 | {tops[0]} | {tops[1]} |" in lines
    ratios = [paired(f, lambda a, b: a / b) for f in (logit, hidden)]
    assert f"| diff | tiny | 2,048 | 2 | {ratios[0]} | {ratios[1]} |" in lines
    for part, digits in (("quantised_loss", 4), ("quantised_accuracy", 3)):
        cols = [lambda r, w=w, part=part: r[part][w] for w in ("fp32", "8", "4")]
        means = " | ".join(ci(values("transformer-tiny", f), digits) for f in cols)
        assert f"| transformer | tiny | 2,048 | 2 | {means} |" in lines
        t_d = [(values("diff-tiny", f), values("transformer-tiny", f)) for f in cols]
        diffs = [ci([d - t for d, t in zip(ds, ts)], digits) for ds, ts in t_d]
        assert f"| diff | tiny | 2,048 | 2 | {' | '.join(x + ' (n=2)' for x in diffs)} |" in lines


def test_runs_without_a_recorded_budget_are_kept():
    from diffllm.studies.common import chosen_runs

    records = [record("diff", s, 3.0, 0.01, tokens=None) for s in (2, 1)]
    assert [r.seed for r in chosen_runs(records)[("diff", "micro-1")]] == [1, 2]
