"""`diffllm study claims` (diffllm/studies/claims.py) on run folders whose eval results are written by the evals' own
pure functions (by_position.curves, icl.summarise) from NLL matrices and correct/wrong tables drawn here: every mean,
95% t-interval (scipy's t quantile) and seed-paired difference to the Transformer against values computed here from
those matrices; the in-length / extrapolation means; the runs grouped by the concrete k each resolved `max` to; a run
without a result is a header line naming its command; no run with a result is a one-line error (real CLI)."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
from scipy import stats

from diffllm.eval.by_position import curves
from diffllm.eval.icl import summarise
from tests.distributed import cli_here
from tests.studies.test_studies import record, study, write

REPO = Path(__file__).resolve().parents[2]
T, TRAIN = 8, 4  # positions scored, the training length: buckets 1, 2-3, 4-7 (extrapolation), 8 (extrapolation)
DOCS, P, Q = 3, 3, 8  # documents per source, orders per k, queries
KS = {("transformer", 1): [0, 2, 27], ("transformer", 2): [0, 2, 27], ("diff", 1): [0, 2, 27], ("diff", 2): [0, 2, 26]}


def nll(arch: str, seed: int) -> np.ndarray:
    """(DOCS, T) NLL of a run: a falling curve, lower for diff, and noise that differs by seed."""
    rng = np.random.default_rng([seed, arch == "diff"])
    return 5.0 - 0.2 * np.log1p(np.arange(T)) - 0.1 * (arch == "diff") + rng.normal(0, 0.3, (DOCS, T))


def correct(arch: str, seed: int, k: int) -> np.ndarray:
    """(P, Q) bools: each order's right answers (k <= 1: one order, repeated, as eval icl scores it)."""
    rng = np.random.default_rng([seed, arch == "diff", k])
    rows = rng.random((P, Q)) < 0.4 + 0.02 * k
    return np.repeat(rows[:1], P, axis=0) if k <= 1 else rows


def ppl_json(m: np.ndarray) -> dict:
    return {"seq_len": T, "train_seq_len": TRAIN, "extrapolation": True, "sources": {"plays": curves(m, TRAIN)}}


def icl_json(arch: str, seed: int) -> dict:
    by_k = {k: {**summarise(correct(arch, seed, k), 0, 0.95, 0), "prompt_tokens": 10 * k} for k in KS[(arch, seed)]}
    return {"task": "synthetic", "chance": 0.5, "queries": Q, "permutations": P, "level": 0.95, "by_k": by_k}


def run_folder(root: Path, name: str, results: dict[str, dict]) -> str:
    """<root>/runs/<name>/eval/ holding `results` ({file name: json})."""
    d = root / "runs" / name
    (d / "eval").mkdir(parents=True)
    for file, res in results.items():
        (d / "eval" / file).write_text(json.dumps(res))
    return str(d)


def sweep(root: Path, ppl: bool = True, icl: bool = True, skip: tuple = ()) -> Path:
    """Transformer and diff, seeds 1-2 at the best lr, each with the results asked for (but not `skip`: (arch, seed,
    file)); and a run at a worse lr whose results would change every number."""
    records = []
    for arch, seed in KS:
        res = {"ppl_by_position.json": ppl_json(nll(arch, seed))} if ppl else {}
        res |= {"icl-synthetic.json": icl_json(arch, seed)} if icl else {}
        res = {f: v for f, v in res.items() if (arch, seed, f) not in skip}
        records.append(record(arch, seed, 3.0, 0.01, run_dir=run_folder(root, f"{arch}{seed}", res)))
    worse = {"ppl_by_position.json": ppl_json(np.full((DOCS, T), 99.0)), "icl-synthetic.json": icl_json("diff", 2)}
    records.append(record("diff", 1, 3.5, 0.02, run_dir=run_folder(root, "diff-lr", worse)))
    return write(root / "runs.csv", records)


def numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", cell.split(" (n=")[0])]


def close(cell: str, xs: list[float], n: int | None = None) -> None:
    """The cell is mean [95% t-interval] of xs (scipy's quantile; printed to 3 decimals), with its n if given."""
    m = statistics.mean(xs)
    want = [m] if len(xs) == 1 else [m, *(m + s * stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs)
                                          / math.sqrt(len(xs)) for s in (-1, 1))]  # fmt: skip
    assert numbers(cell) == [round(x, 3) for x in numbers(cell)] and len(numbers(cell)) == len(want), cell
    assert all(abs(a - b) < 1e-3 for a, b in zip(numbers(cell), want)), (cell, want)
    assert cell.endswith(f" (n={n})") if n else "(n=" not in cell, cell


def table(text: str, title: str) -> dict[str, list[str]]:
    """The markdown table after the line `title`: first cell -> the other cells."""
    lines = text.splitlines()
    start = lines.index(title) + 2
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    assert head == ["positions" if "NLL" in title else "k", "transformer", "diff", "diff - transformer"], head
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_nll_by_position_means_intervals_and_seed_paired_differences(tmp_path):
    code, out, err = study("claims", f"sweep_dir={sweep(tmp_path)}", f"out={tmp_path / 'o'}")
    assert code == 0, err
    assert (tmp_path / "o" / "claims.md").read_text() == out
    assert "4 runs: transformer, diff at micro-1, seeds 1, 2;" in out and "1 other run(s)" in out  # the worse lr
    assert "99.0" not in out and "Missing" not in out
    m = {(a, s): nll(a, s) for a, s in KS}
    for field, title in (("nll", "NLL per bucket"), ("cumulative", "cumulative average NLL at the bucket's end")):
        rows = table(out, f"micro-1, source plays, {title}:")
        assert list(rows) == ["1", "2-3", "4-7 extrapolation", "8 extrapolation"]
        for label, (lo, hi) in zip(rows, [(1, 1), (2, 3), (4, 7), (8, 8)]):

            def value(a: str, s: int, lo=lo, hi=hi, field=field) -> float:  # a run's value, from its NLL matrix
                x = m[(a, s)]
                return x[:, lo - 1 : hi].mean() if field == "nll" else x.mean(0)[:hi].mean()

            t, d = ([value(a, s) for s in (1, 2)] for a in ("transformer", "diff"))
            close(rows[label][0], t)
            close(rows[label][1], d)
            close(rows[label][2], [x - y for x, y in zip(d, t)])
    spans = {a: [[m[(a, s)].mean(0)[part].mean() for s in (1, 2)] for part in (slice(0, 4), slice(4, 8))]
             for a in ("transformer", "diff")}  # fmt: skip
    line = next(x for x in out.splitlines() if x.startswith("- diff: 1-4: "))
    title = "micro-1, source plays, mean NLL over positions 1-4 (within the training length, 4) and 5-8 (extrapolation)"
    assert title + ":" in out
    cells = re.findall(r"(-?\d\.\d+(?: \[[^]]+\])?)", line)
    (inside, inside_d), (past, past_d) = cells[:2], cells[2:]
    close(inside, spans["diff"][0])
    close(past, spans["diff"][1])
    close(inside_d, [x - y for x, y in zip(spans["diff"][0], spans["transformer"][0])])
    close(past_d, [x - y for x, y in zip(spans["diff"][1], spans["transformer"][1])])
    assert "5-8: " in line and ", minus transformer " in line


def test_icl_accuracy_by_concrete_k_and_order_robustness(tmp_path):
    code, out, err = study("claims", f"sweep_dir={sweep(tmp_path)}", f"out={tmp_path / 'o'}")
    assert code == 0, err
    acc = {(a, s, k): correct(a, s, k).mean(1) for (a, s), ks in KS.items() for k in ks}  # each order's accuracy

    def per_seed(a: str, k: int, f) -> dict[int, float]:
        return {s: f(acc[(a, s, k)]) for s in (1, 2) if (a, s, k) in acc}

    rows = table(out, "micro-1, accuracy by k (demonstrations):")
    assert list(rows) == ["0", "2", "26", "27"]  # diff seed 2's `max` resolved to 26, the others' to 27
    for k, (n_t, n_d) in {0: (None, None), 2: (None, None), 27: (None, 1)}.items():
        t, d = per_seed("transformer", k, np.mean), per_seed("diff", k, np.mean)
        close(rows[str(k)][0], list(t.values()), n_t)
        close(rows[str(k)][1], list(d.values()), n_d)
        close(rows[str(k)][2], [d[s] - t[s] for s in d if s in t], n_d)
    assert rows["26"][0] == "-" and rows["26"][2] == "-"
    close(rows["26"][1], [acc[("diff", 2, 26)].mean()], 1)
    assert "- micro-1: k=26 in 1 of 4 runs (not in transformer seed 1, transformer seed 2, diff seed 1;" in out
    assert "- micro-1: k=27 in 3 of 4 runs (not in diff seed 2;" in out
    assert "- chance: 0.5" in out and f"- orders per k (permutations): {P}" in out
    for what, f in (("spread (max - min)", lambda a: a.max() - a.min()), ("std", lambda a: statistics.stdev(a))):
        title = f"micro-1, order robustness: {what} of the accuracy over the orders of the same demonstrations:"
        rows = table(out, title)
        assert list(rows) == ["2", "26", "27"]  # k = 0 has one order
        t, d = per_seed("transformer", 2, f), per_seed("diff", 2, f)
        assert min(t.values()) > 0  # the drawn tables do differ between orders
        close(rows["2"][0], list(t.values()))
        close(rows["2"][1], list(d.values()))
        close(rows["2"][2], [d[s] - t[s] for s in d])


def test_a_run_without_a_result_is_a_line_naming_the_command(tmp_path):
    code, out, err = study("claims", f"sweep_dir={sweep(tmp_path, skip=(('diff', 2, 'icl-synthetic.json'),))}")
    assert code == 0, err
    d2 = tmp_path / "runs" / "diff2"
    missing = [x for x in out.splitlines() if x.startswith(f"- {d2}")]
    assert missing == [
        f'- {d2}: no icl-synthetic.json; run `diffllm eval icl run={d2} "k=[0,2,27]" permutations={P} queries={Q}`'
    ]
    assert "k=26" not in out  # the run that resolved max to 26 has no ICL results here
    assert (tmp_path / "claims.md").read_text() == out  # default out: the runs.csv's folder


def test_a_result_no_run_has_is_one_line_naming_its_command(tmp_path):
    runs_csv = sweep(tmp_path, ppl=False, icl=False)
    done = cli_here("study", "claims", f"sweep_dir={runs_csv}")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"diffllm study claims: error: sweep_dir={runs_csv}: no selected run has ppl_by_position.json or "
        "icl-synthetic.json in its eval/; run `diffllm eval ppl run=<run> by_position=true` and `diffllm eval icl "
        "run=<run>` on each of its 4 selected runs first\n"
    )
    code, out, err = study("claims", f"sweep_dir={sweep(tmp_path / 'b', icl=False)}")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "no selected run has icl-synthetic.json in its eval/; run `diffllm eval icl run=<run>` on each" in err
