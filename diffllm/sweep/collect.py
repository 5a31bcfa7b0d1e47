"""`diffllm sweep collect`: every run under a sweep directory -> one table (runs.csv + runs.md). Runs without a
summary are listed as unfinished, never dropped.

The rows are the run records of diffllm/results.py (summary, axes, Kaplan N), each with its reference baselines
(unigram and bigram cross-entropy of its validation windows, diffllm/scaling/baselines.py), whether it is
under-trained (does not beat the bigram), and whether it is at the best-of-grid value of its group
(diffllm/scaling/select.py)."""

from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

from ..errors import UserError
from ..results import RunRecord, axis_names, to_csv, trained_compute, trained_wall
from ..results import collect as collect_runs
from ..scaling.baselines import BASELINES_NOTE, add_baselines
from ..scaling.config import DEFAULT_SELECT, DEFAULT_SELECT_BY
from ..scaling.protocol import check_protocol
from ..scaling.select import (
    check_select,
    check_select_by,
    choices_markdown,
    mark_selected,
    select_runs,
    selection_dict,
    short_label,
    value_label,
)


def collect(
    root: str | Path,
    select: Optional[str] = DEFAULT_SELECT,
    baselines: bool = True,
    notes: Optional[list[str]] = None,
    by: str = DEFAULT_SELECT_BY,
    **protocol,
) -> list[RunRecord]:
    """Every run under `root`, sorted, with its axes; with `baselines`, its reference baselines (cached in
        <root>/.baselines) and under-trained flag; its `selected` flag: reported at the value of `select` chosen by the
    metric `by` under the selection protocol (`protocol`: select_runs' select_protocol keywords, by name `protocol`,
    `select_seeds`, `report_seeds`; diffllm/scaling/protocol.py).
        Problems that do not stop the table (a baseline that cannot be computed) are appended to `notes` (without:
        printed as warnings)."""
    check_protocol(protocol.get("protocol", "same"), protocol.get("select_seeds"), protocol.get("report_seeds"))
    records = collect_runs(root)
    check_select(select, set(axis_names(records)))  # a typo fails before the baselines are counted
    check_select_by(by)
    if baselines:
        found: list[str] = []
        add_baselines(records, Path(root), found)
        if notes is None:
            for note in found:
                print(f"warning: {note}", file=sys.stderr)
        else:
            notes += found
    mark_selected(records, select, by, **protocol)
    return records


def _cell(column: str, v: object) -> str:
    if v is None:
        return "-"
    if column in ("total_params", "nonembedding_params", "block_params", "tokens"):
        return f"{v:,}"
    if column == "flops":
        return f"{v:.3g}"
    if column == "wall_time_s":
        return f"{v:.0f}"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def _rel(run_dir: str, root: str | Path) -> str:
    return str(Path(run_dir).relative_to(root)) if root and Path(run_dir).is_relative_to(root) else run_dir


def _branch_cell(r: RunRecord, root: str | Path) -> str:
    """A WSD cooldown: `<parent> @ <tokens shared>`; any other run: -."""
    if not r.branch_parent:
        return "-"
    shared = f"{r.branch_tokens:,}" if r.branch_tokens is not None else "?"
    return f"{_rel(r.branch_parent, Path(root).resolve() if root else root)} @ {shared}"


def compute_line(records: list[RunRecord]) -> str:
    """What the runs trained together: a cooldown's prefix is counted once, by its parent."""
    tokens, flops = trained_compute(records)
    shared = sum((r.tokens or 0) for r in records) - tokens
    note = f" ({shared:,} tokens that WSD cooldowns share with their parents counted once)" if shared else ""
    wall = trained_wall(records)
    timed = (
        ""
        if wall is None
        else (
            f" Wall time: {wall[0]:,.0f} s (cooldowns: their own steps); from scratch at "
            f"the same times per token: {wall[1]:,.0f} s (branch / scratch "
            f"{wall[0] / wall[1]:.3f})."
        )
    )
    return f"Trained in all: {tokens:,} tokens, {flops:.4g} FLOPs{note}.{timed}"


def _axis_label(key: str, value: Any, varies: bool) -> str:
    """A null that never changes within the row's arch is "-" (not applicable: a Transformer's λ_init)."""
    return "-" if value is None and not varies else value_label(key, value)


def to_markdown(
    records: list[RunRecord],
    root: str | Path = "",
    select: Optional[str] = DEFAULT_SELECT,
    by: str = DEFAULT_SELECT_BY,
    **protocol,
) -> str:
    """The runs table (axes by short label; `*` marks the runs at their group's best-of-grid value, `under-trained`
    those that do not beat the bigram), then the best-of-grid table and its warnings, and what the baselines are."""
    axes = axis_names(records)
    cols = [
        "model",
        "arch",
        "seed",
        "total_params",
        "block_params",
        "tokens",
        "flops",
        "final_train_loss",
        "final_val_loss",
        "unigram_loss",
        "bigram_loss",
        "kn3_loss",
        "kn4_loss",
        "lambda_min",
        "lambda_lowest",
        "spikes",
        "skipped_steps",
        "max_grad_norm",
        "act_max",
        "attn_logit_max",
        "wall_time_s",
        "status",
    ]
    if any(r.recall_acc is not None for r in records):  # runs with in-loop recall evaluation
        cols[-2:-2] = ["recall_acc", "recall_step_50", "recall_step_90"]
    head = cols[:3] + [short_label(k) for k in axes] + cols[3:]
    varies = {
        a: {k for k in axes if len({repr(r.axes.get(k)) for r in records if r.arch == a}) > 1}
        for a in {r.arch for r in records}
    }
    lines = ["| " + " | ".join(head) + " | branch of @ tokens | selected | run_dir |", "|" + "---|" * (len(head) + 3)]
    for r in records:
        d = asdict(r)
        cells = [_cell(c, d[c]) for c in cols[:3]]
        cells += [_axis_label(k, r.axes.get(k), k in varies[r.arch]) for k in axes]
        cells += [_cell(c, d[c]) for c in cols[3:]]
        if r.under_trained:
            cells[-1] += " (under-trained)"
        lines.append(
            "| " + " | ".join(cells) + f" | {_branch_cell(r, root)} | {'*' if r.selected else ''} | "
            f"{_rel(r.run_dir, root)} |"
        )
    lines += ["", compute_line(records)]
    sel = select_runs(records, select, by, **protocol)
    if sel.select:
        lines += [""] + choices_markdown(selection_dict(sel))
    if any(r.bigram_loss is not None for r in records):
        lines += ["", BASELINES_NOTE]
    return "\n".join(lines) + "\n"


def write_tables(
    records: list[RunRecord],
    root: str | Path,
    out: str | Path,
    select: Optional[str] = DEFAULT_SELECT,
    by: str = DEFAULT_SELECT_BY,
    **protocol,
) -> tuple[Path, Path]:
    """runs.csv (its run paths relative to `out`) and runs.md under `out`; best-of-grid edge warnings also go to
    stderr."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "runs.csv", out / "runs.md"
    csv_path.write_text(to_csv(records, out))  # run paths relative to out
    md_path.write_text(to_markdown(records, root, select, by, **protocol))
    for w in select_runs(records, select, by, **protocol).warnings:
        print(f"warning: {w}", file=sys.stderr)
    return csv_path, md_path


def check_keep(names: list[str], root: str | Path, out: Optional[str | Path]) -> None:
    """`keep`'s file names are paths inside a run folder, and its copies go outside the sweep (a copy inside it would
    be collected again as a run)."""
    for name in names:
        if Path(name).is_absolute() or ".." in Path(name).parts or not name.strip():
            raise UserError(f"keep: {name!r} is not a path inside a run folder (e.g. eval/recall.json)")
    if names and out is None:
        raise UserError("keep: needs out=<a folder outside the sweep> for the copies and the table")
    if names and Path(out).resolve().is_relative_to(Path(root).resolve()):
        raise UserError(f"keep: out={out} is inside sweep_dir={root} (its copies would be collected as runs)")


def keep_files(records: list[RunRecord], root: str | Path, out: str | Path, names: list[str]) -> list[RunRecord]:
    """Copies each run's files `names` (paths inside its folder: metrics.jsonl, eval/recall.json...) to
    <out>/runs/<its path under root>/ and returns the records pointing there, so that a committed runs.csv carries the
    per-run data a study reads. A run without one of the files gets no copy of it, and a warning counts them. The new
    <out>/runs replaces the old one only once every copy is made."""
    root, staging, final = Path(root).resolve(), Path(out) / ".runs.partial", Path(out) / "runs"
    shutil.rmtree(staging, ignore_errors=True)
    missing: dict[str, int] = {}
    kept = []
    for r in records:
        dest = staging / Path(r.run_dir).resolve().relative_to(root)
        for name in names:
            src = Path(r.run_dir) / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
            else:
                missing[name] = missing.get(name, 0) + 1
        kept.append(replace(r, run_dir=str(final.resolve() / dest.relative_to(staging))))
    shutil.rmtree(final, ignore_errors=True)
    if staging.exists():
        staging.rename(final)
    for name, n in missing.items():
        print(f"warning: keep: {n} of {len(records)} runs have no {name} (not copied)", file=sys.stderr)
    return kept
