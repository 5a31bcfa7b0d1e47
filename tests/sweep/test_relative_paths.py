"""runs.csv holds its run paths relative to its own folder (a sweep's: relative to the sweep), and every reader
resolves them against the CSV's location: a collected sweep folder moved elsewhere is still read whole, its runs'
files found; older tables with absolute paths are read as they are."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess

import yaml

from diffllm.results import read_csv, to_csv, trained_compute
from diffllm.sweep.collect import collect, write_tables
from tests.distributed import REPO, cli_here

LAMBDAS = [{"step": 25, "lambda/0": 0.5, "lambda/1": 0.4}, {"step": 50, "lambda/0": -0.1, "lambda/1": 0.3}]


def fake_run(root, lr: float, tokens: int, parent=None):
    """A finished diff-micro-1 run folder: config.yaml (its lr), summary.json (a WSD cooldown names its parent by
    absolute path, as the trainer writes it) and metrics.jsonl with per-layer lambdas."""
    run = root / "diff-micro-1" / str(tokens) / f"lr={lr:g}" / "seed1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"optim": {"lr": lr}, "seed": 1, "run_dir": str(run)}))
    summary = {
        "model": "diff-micro-1",
        "arch": "diff",
        "tokens": tokens,
        "flops": float(tokens),
        "final_train_loss": 3.0,
        "final_val_loss": 3.1,
        "status": "finished",
        "seed": 1,
        "branch": {"parent": str(parent), "tokens": tokens // 2} if parent else None,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("".join(json.dumps({**m, "lambda_min": -0.1}) + "\n" for m in LAMBDAS))
    return run


def test_a_moved_sweep_is_still_read_with_its_runs(tmp_path):
    sweep = tmp_path / "here" / "sweep"
    parents = {lr: fake_run(sweep, lr, 2000) for lr in (0.01, 0.02)}
    for lr, parent in parents.items():
        fake_run(sweep, lr, 1000, parent)
    write_tables(collect(sweep, baselines=False), sweep, sweep)  # what `diffllm sweep collect` does
    rows = list(csv.DictReader(open(sweep / "runs.csv")))
    paths = [r["run_dir"] for r in rows] + [r["branch_parent"] for r in rows if r["branch_parent"]]
    assert len(paths) == 6 and all(p.startswith("diff-micro-1/") for p in paths), paths  # relative to the sweep

    moved = tmp_path / "elsewhere" / "copy"
    moved.parent.mkdir()
    shutil.move(sweep, moved)
    records = read_csv(moved / "runs.csv")
    assert sorted(r.run_dir for r in records) == sorted(str(p.parent) for p in moved.rglob("summary.json"))
    parent_of = {r.run_dir: r.branch_parent for r in records if r.branch_parent}
    assert {d.split("/lr=")[1] for d in parent_of} == {"0.01/seed1", "0.02/seed1"}
    assert all(p.startswith(str(moved)) and p.replace("/2000/", "/1000/") == d for d, p in parent_of.items())
    assert trained_compute(records)[0] == 2 * 2000 + 2 * 500  # each cooldown's shared half counted once, by its parent

    # a study reads the runs' own metrics.jsonl through the moved table (its second table needs the run folders)
    done = cli_here("study", "stability", f"sweep_dir={moved / 'runs.csv'}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("| 1 | 50 | 0 | -0.1, 0.3 |") == 4, done.stdout  # one lambda row per run


def test_absolute_and_csv_relative_paths_read_back(tmp_path):
    """An older table's absolute paths stay; a table written into another folder points back with '..'."""
    run = fake_run(tmp_path / "sweep", 0.01, 2000)
    records = collect(tmp_path / "sweep", baselines=False)
    (tmp_path / "old.csv").write_text(to_csv(records))  # no folder: paths as they are (absolute here)
    assert next(csv.DictReader(open(tmp_path / "old.csv")))["run_dir"] == str(run)
    assert read_csv(tmp_path / "old.csv") == records
    write_tables(records, tmp_path / "sweep", tmp_path / "tables")
    assert next(csv.DictReader(open(tmp_path / "tables" / "runs.csv")))["run_dir"].startswith("../sweep/")
    assert read_csv(tmp_path / "tables" / "runs.csv") == records


def collect_cli(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return cli_here("sweep", "collect", *args, cwd=cwd)


def test_keep_commits_the_runs_files_a_study_reads_with_the_table(tmp_path):
    """`sweep collect keep=[...]` copies those files of each run under <out>/runs/ and points runs.csv there: with
    the sweep folder gone, a study still reads every run's metrics from the table's folder alone."""
    sweep, out = tmp_path / "sweep", tmp_path / "results" / "study"
    runs = [fake_run(sweep, lr, 2000) for lr in (0.01, 0.02)]
    (runs[0] / "eval").mkdir()
    (runs[0] / "eval" / "recall.json").write_text('{"acc": 0.5}')
    keep = "keep=[metrics.jsonl,eval/recall.json]"
    done = collect_cli("sweep_dir=sweep", "out=results/study", "select=null", keep, cwd=tmp_path)  # relative, as typed
    assert done.returncode == 0, done.stderr
    assert "warning: keep: 1 of 2 runs have no eval/recall.json (not copied)" in done.stderr
    kept = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p.parent != out)
    assert [str(p) for p in kept] == [
        "runs/diff-micro-1/2000/lr=0.01/seed1/eval/recall.json",
        "runs/diff-micro-1/2000/lr=0.01/seed1/metrics.jsonl",
        "runs/diff-micro-1/2000/lr=0.02/seed1/metrics.jsonl",
    ]
    assert (out / "runs" / "diff-micro-1/2000/lr=0.01/seed1/metrics.jsonl").read_bytes() == (
        runs[0] / "metrics.jsonl"
    ).read_bytes()
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert sorted(r["run_dir"] for r in rows) == [f"runs/diff-micro-1/2000/lr={lr}/seed1" for lr in ("0.01", "0.02")]
    assert str(tmp_path) not in (out / "runs.md").read_text()  # the committed table names no machine's paths

    shutil.rmtree(sweep)
    study = cli_here("study", "stability", f"sweep_dir={out / 'runs.csv'}")
    assert study.returncode == 0, study.stderr
    assert study.stdout.count("| 1 | 50 | 0 | -0.1, 0.3 |") == 2, study.stdout  # both runs' lambdas, from the copies


def test_keep_refuses_a_path_outside_the_run_and_an_out_inside_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep, 0.01, 2000)
    bad_name = collect_cli(f"sweep_dir={sweep}", f"out={tmp_path / 'out'}", "keep=[../secret]")
    assert bad_name.returncode != 0
    assert "keep: '../secret' is not a path inside a run folder" in bad_name.stderr.strip().splitlines()[-1]
    no_out = collect_cli(f"sweep_dir={sweep}", "keep=[metrics.jsonl]")
    assert no_out.returncode != 0 and "keep: needs out=<a folder outside the sweep>" in no_out.stderr
    inside = collect_cli(f"sweep_dir={sweep}", f"out={sweep / 'tables'}", "keep=[metrics.jsonl]")
    assert inside.returncode != 0 and "is inside sweep_dir=" in inside.stderr
    assert not (sweep / "tables").exists() and not (sweep / "runs.csv").exists()  # nothing written


def test_the_committed_study_tables_name_no_absolute_path():
    """Every CSV under results/ (the studies' committed runs) names its runs relative to its own folder, and the runs
    a study kept beside its table (`keep=`: under the table's runs/ folder) are there, found from the table's place."""
    tables = sorted((REPO / "results").rglob("*.csv"))
    assert len(tables) >= 19  # the studies' runs.csv files: a glob that found none would pass below
    absolute = [
        f"{t.relative_to(REPO)}: {c}"
        for t in tables
        for row in csv.reader(t.read_text().splitlines())
        for c in row
        if c[:1] == "/"
    ]
    assert not absolute, "committed tables hold absolute paths:\n" + "\n".join(absolute[:5])
    kept = [
        (t, r["run_dir"])
        for t in tables
        if (t.parent / "runs").is_dir()
        for r in csv.DictReader(t.read_text().splitlines())
    ]
    missing = [f"{t.relative_to(REPO)}: {d}" for t, d in kept if not (t.parent / d / "metrics.jsonl").is_file()]
    assert len(kept) >= 303 and not missing, missing[:5]  # 5 studies' kept runs, each with its metrics.jsonl
