"""What the studies share: where their runs come from (a sweep directory, collected here, or the runs.csv `sweep
collect` wrote for one), a run's series with the learning rate left out, the median of "steps to a level" with how
many seeds got there, a mean's 95% t-interval over seeds, a run's eval results, the (size, series) order of every
table, and where the text goes."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, TypeVar

from ..errors import UserError
from ..results import RunRecord, read_csv
from ..runs import read_json
from ..scaling.select import select_runs, series_without, size_of

LR = "optim.lr"
V = TypeVar("V")


def read_records(source: str, key: str, **collect_kwargs: Any) -> list[RunRecord]:
    """The run records of `source` (the study's key `key`): a collected runs.csv, or a sweep directory collected here
    with `collect_kwargs` (diffllm.sweep.collect.collect's select and baselines)."""
    from ..sweep.collect import collect

    if not source:
        raise UserError(f"{key}: missing; pass {key}=<sweep directory or its collected runs.csv>")
    path = Path(source)
    if not path.exists():
        raise UserError(f"{key}={source}: does not exist (give a sweep directory or its collected runs.csv)")
    return read_csv(path) if path.is_file() else collect(path, **collect_kwargs)


def folder_of(source: str) -> Path:
    """The folder a study writes into by default: the sweep directory, or the folder of its runs.csv."""
    path = Path(source)
    return path if path.is_dir() else path.parent


def series_without_lr(records: list[RunRecord]) -> dict[str, str]:
    """run_dir -> series: the arch and those of its axes other than the learning rate whose values differ among the
    arch's runs (`sweep collect`'s series, with the lr left free so that a study can compare across it)."""
    return series_without(records, {LR})


def reached(steps: list, runs: int) -> str:
    """`median (got/runs)` of the steps at which the runs that got there reached a level; `- (0/runs)` if none did."""
    got = [s for s in steps if s is not None]
    return f"{statistics.median(got):.0f} ({len(got)}/{runs})" if got else f"- (0/{runs})"


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # two-sided 95%


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval over seeds (a point with one seed has no interval: nan)."""
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def fmt_ci(xs: list[float], digits: int = 3) -> str:
    m, lo, hi = t_interval(xs)
    return f"{m:.{digits}f}" if math.isnan(lo) else f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def eval_json(r, name: str) -> dict | None:
    """<run>/eval/<name>, or None where the eval command has not run on it."""
    path = Path(r.run_dir) / "eval" / name
    return read_json(path) if path.is_file() else None


def chosen_runs(records) -> dict[tuple, list]:
    """(series, size) -> the selected runs (best-of-grid) of its largest budget, sorted by seed: the runs `study
    outliers` and `study claims` read."""
    sel = select_runs(records)
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:
        if r.run_dir in sel.selected:
            groups[(sel.series[r.run_dir], size_of(r.model, r.arch))].append(r)
    return {
        key: sorted((r for r in rs if (r.tokens or 0) == max(x.tokens or 0 for x in rs)), key=lambda r: r.seed or 0)
        for key, rs in groups.items()
    }


def by_size(table: dict[tuple, V]) -> Iterable[tuple[tuple, V]]:
    """The items of a {(series, size, ...): value} table in table order: by size, then series."""
    return sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0]))


def emit(text: str, out: Optional[str | Path]) -> str:
    """A study's text on stdout, and into the file `out` when given (its folder made)."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    print(text, end="")
    return text
