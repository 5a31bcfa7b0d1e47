"""What `scaling fit` reads: the runs of a sweep folder or of its committed runs.csv, and a run's validation curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UserError
from ..results import RunRecord, collect, read_csv
from ..runs import read_metrics
from .baselines import add_baselines


def val_curve(run_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, val_loss) of every evaluation after step 0, from metrics.jsonl."""
    pts = sorted(
        {
            r["tokens"]: r["val_loss"]
            for r in read_metrics(run_dir)
            if r.get("val_loss") is not None and r.get("tokens")
        }.items()
    )
    return np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)


def read_all(sweep_dir: str, add_runs: list[str], notes: list[str]) -> tuple[list[RunRecord], Path]:
    """sweep_dir's runs, then each of `add_runs`' (a sweep trained over several sessions: each session's collected
    runs.csv), in that order, and sweep_dir's report folder; a run that two of them hold is a one-line error."""
    runs, folder = read_runs(sweep_dir, notes)
    where = {r.run_dir: sweep_dir for r in runs}
    for source in add_runs:
        more, _ = read_runs(source, notes, "add_runs")
        twice = next((r.run_dir for r in more if r.run_dir in where), None)
        if twice:
            raise UserError(f"add_runs: {source} holds {twice}, which {where[twice]} holds too; give each run once")
        where.update({r.run_dir: source for r in more})
        runs += more
    return runs, folder


def read_runs(sweep_dir: str, notes: list[str], key: str = "sweep_dir") -> tuple[list[RunRecord], Path]:
    """The runs of a sweep folder (collected here, baselines computed and cached in it) or of its collected runs.csv
    (as collected: its baselines, no recomputation, so that a committed table fits where its runs are not), and the
    folder the report goes to by default."""
    path = Path(sweep_dir)
    if not path.is_file():
        runs = collect(sweep_dir)
        add_baselines(runs, path, notes)
        return runs, path
    try:
        runs = read_csv(path)
    except (KeyError, ValueError, TypeError) as e:
        raise UserError(f"{key}={sweep_dir}: not a runs.csv of `diffllm sweep collect` ({e})") from None
    if not runs:
        raise UserError(f"{key}={sweep_dir}: holds no runs")
    if not any(Path(r.run_dir).is_dir() for r in runs):
        notes.append(
            f"{sweep_dir}: none of its run folders is here, so validation learning curves (L(N, D) of a single "
            "budget) cannot be read; the baselines are the table's"
        )
    return runs, path.parent
