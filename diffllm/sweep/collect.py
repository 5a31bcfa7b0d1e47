"""`diffllm sweep collect`: every run's summary.json under a sweep directory -> one table (CSV + markdown).
Runs without a summary are listed as unfinished, never dropped.

Besides the summary, each row carries its run's *axes*: the dotted config keys (config.yaml) whose values differ
between the runs of its (model, tokens) group, bookkeeping left out (run_dir, seeds, resume, paths); its reference
baselines (unigram and bigram cross-entropy of its validation windows, diffllm/scaling/baselines.py); whether it is
under-trained (does not beat the bigram); and whether it is at the best-of-grid value of its group
(diffllm/scaling/select.py)."""
from __future__ import annotations

import csv
import functools
import io
import json
import re
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from ..runs import METRICS_FILE, SUMMARY_FILE, Run, read_metrics
from ..scaling.select import (DEFAULT_SELECT, choices_markdown, select_runs, selection_dict, short_label,
                              value_label)


@dataclass
class RunRecord:
    run_dir: str
    model: str
    arch: str
    seed: Optional[int]
    total_params: Optional[int]
    nonembedding_params: Optional[int]
    block_params: Optional[int]  # non-embedding minus an untied output head: Kaplan's N
    tokens: Optional[int]
    flops: Optional[float]
    final_train_loss: Optional[float]
    final_val_loss: Optional[float]
    wall_time_s: Optional[float]
    world_size: Optional[int]
    status: str
    unigram_loss: Optional[float] = None  # reference baselines on the run's validation windows (nats/token)
    bigram_loss: Optional[float] = None
    under_trained: Optional[bool] = None  # final_val_loss does not beat bigram_loss
    selected: Optional[bool] = None  # at the best-of-grid value of its (series, size, budget) group
    lambda_min: Optional[float] = None  # Diff: the min over layers of lambda at the last metrics record
    lambda_lowest: Optional[float] = None  # Diff: the lowest lambda_min of any record (negative: a map was added)
    axes: dict = field(default_factory=dict)  # dotted config key -> value, for every axis of the sweep


COLUMNS = [f.name for f in fields(RunRecord) if f.name != "axes"]
BOOKKEEPING = {"run_dir", "seed", "data.seed", "trainer.resume", "model.name", "data.tokenizer.path",
               "model.init_from", "data.prepared_dir", "logging.name", "logging.tags"}
PATHY = ("path", "dir", "run_dir", "prepared_dir")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.002}} -> {"optim.lr": 0.002}; list items as <key>.<index> (so a source's fields count)."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
        items = ((str(i), v) for i, v in enumerate(node))
    else:
        return {prefix: tuple(node) if isinstance(node, list) else node}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def bookkeeping(key: str, values: list) -> bool:
    """Keys that differ between runs without being a hyperparameter: seeds, where things are, how to resume."""
    if key in BOOKKEEPING or any(part in PATHY or part.endswith(("_dir", "_path")) for part in key.split(".")):
        return True
    return any(isinstance(v, str) and ("/" in v or v.startswith(("pkg:", "~"))) for v in values)


def find_axes(configs: dict[tuple, list[dict]]) -> list[str]:
    """Flattened keys whose values differ within some (model, tokens) group of run configs, bookkeeping left out (and
    keys that not every config of the group has: runs saved by another diffllm version, e.g. before a key existed)."""
    axes = set()
    for flats in configs.values():
        # a key only some configs have was added (or dropped) by another diffllm version, not varied by the sweep
        for key in set.intersection(*(set(f) for f in flats)) if flats else ():
            values = [f.get(key) for f in flats]
            if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1 and not bookkeeping(key, values):
                axes.add(key)
    return sorted(axes)


def _seed(summary: dict, run: Run) -> Optional[int]:
    if summary.get("seed") is not None:
        return int(summary["seed"])
    config = run.config() or {}
    if config.get("seed") is None and (run.dir / ".hydra" / "config.yaml").exists():  # a run of older diffllm
        config = yaml.safe_load((run.dir / ".hydra" / "config.yaml").read_text()) or {}
    if config.get("seed") is not None:
        return int(config["seed"])
    run_dir = run.dir
    m = re.search(r"seed(\d+)", run_dir.name)
    return int(m.group(1)) if m else None


def block_params(model: str, total: Optional[int], nonembedding: Optional[int]) -> Optional[int]:
    """Non-embedding parameters without the output head, when the preset says whether the head is tied."""
    from ..model.presets import load_preset

    if total is None or nonembedding is None:
        return None
    try:
        tied = load_preset(model).tie_embeddings
    except ValueError:
        return None
    return nonembedding if tied else nonembedding - (total - nonembedding)  # untied head = embedding's size


def _preset_in_path(run_dir: Path) -> str:
    """A run without a summary yet: the preset named by a folder on its path (sweeps use <model>/<tokens>/seed<s>)."""
    from ..model.presets import preset_names

    names = set(preset_names())
    return next((part for part in reversed(run_dir.parts) if part in names), run_dir.name)


def lambda_stats(run_dir: Path) -> tuple[Optional[float], Optional[float]]:
    """(last, lowest) lambda_min of the run's metrics.jsonl records (the trainer's Diff diagnostics); Nones without."""
    values = [r["lambda_min"] for r in read_metrics(run_dir) if r.get("lambda_min") is not None]
    return (values[-1], min(values)) if values else (None, None)


def read_run(run_dir: Path) -> RunRecord:
    """One run's summary (axes are filled in by `collect`, which sees the other runs)."""
    run = Run(run_dir)
    s = run.summary() or {}  # a damaged summary.json: a one-line ValueError naming it
    model = s.get("model") or _preset_in_path(run_dir)
    return RunRecord(
        run_dir=str(run_dir), model=model, arch=s.get("arch") or _preset_arch(model),
        seed=_seed(s, run), total_params=s.get("total_params"), nonembedding_params=s.get("nonembedding_params"),
        block_params=block_params(model, s.get("total_params"), s.get("nonembedding_params")),
        tokens=s.get("tokens"), flops=s.get("flops"), final_train_loss=s.get("final_train_loss"),
        final_val_loss=s.get("final_val_loss"), wall_time_s=s.get("wall_time_s"), world_size=s.get("world_size"),
        status=s.get("status", "unfinished") if s else "unfinished", **dict(zip(("lambda_min", "lambda_lowest"),
                                                                                 lambda_stats(run_dir))),
    )


def run_dirs(root: Path) -> list[Path]:
    """Directories holding a run: a summary.json, a metrics.jsonl or a checkpoints/ folder."""
    marks = (SUMMARY_FILE, METRICS_FILE, "checkpoints")
    found = {p.parent for m in marks for p in root.rglob(m) if "checkpoints" not in p.parent.parts}
    return sorted(found)


def _flat_config(run_dir: Path) -> dict[str, Any]:
    return flatten(Run(run_dir).config() or {})


def collect(root: str | Path, select: Optional[str] = DEFAULT_SELECT, baselines: bool = True,
            notes: Optional[list[str]] = None) -> list[RunRecord]:
    """Every run under `root`, sorted, with its axes; with `baselines`, its reference baselines (cached in
    <root>/.baselines) and under-trained flag; its `selected` flag from best-of-grid over `select`. Problems that do
    not stop the table (a baseline that cannot be computed) are appended to `notes`."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"sweep_dir={root}: no such directory")
    records = [read_run(d) for d in run_dirs(root)]
    if not records:
        raise ValueError(f"sweep_dir={root}: no runs found (no summary.json, metrics.jsonl or checkpoints/ below)")
    flats = {r.run_dir: _flat_config(Path(r.run_dir)) for r in records}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if flats[r.run_dir]:
            groups[(r.model, r.tokens)].append(flats[r.run_dir])
    axes = find_axes(groups)
    for r in records:
        r.axes = {k: flats[r.run_dir].get(k) for k in axes}
    if baselines:
        found: list[str] = []
        add_baselines(records, root, found)
        if notes is None:
            for note in found:
                print(f"warning: {note}", file=sys.stderr)
        else:
            notes += found
    sel = select_runs(records, select)
    for r in records:
        r.selected = (r.run_dir in sel.selected) if r.run_dir in sel.series else None
    return sorted(records, key=lambda r: (r.arch, _preset_size(r.model), r.tokens or 0, r.seed or 0, r.run_dir))


def add_baselines(records: list[RunRecord], root: Path, notes: list[str]) -> None:
    """Each finished run's unigram/bigram losses and under-trained flag (runs without a config.yaml: none)."""
    from ..scaling.baselines import run_baselines

    failed: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.status != "finished" or not (Path(r.run_dir) / "config.yaml").is_file():
            continue
        try:
            b = run_baselines(Path(r.run_dir), root / ".baselines")
        except ValueError as e:  # the data cannot be read here: the table goes on without this run's baselines
            failed[str(e)].append(r.run_dir)
            continue
        r.unigram_loss, r.bigram_loss = b.unigram, b.bigram
        if r.final_val_loss is not None:
            r.under_trained = r.final_val_loss >= b.bigram
    for why, dirs in failed.items():
        notes.append(f"baselines not computed for {len(dirs)} run(s) (first: {dirs[0]}): {why}")


@functools.lru_cache(maxsize=None)
def _preset_arch(model: str) -> str:
    """A run without a summary yet: the arch its preset names ("unknown" for a name that is no preset)."""
    from ..model.presets import load_preset

    try:
        return load_preset(model).arch
    except ValueError:
        return "unknown"


@functools.lru_cache(maxsize=None)
def _preset_size(model: str) -> int:
    """Sort key: the preset's parameter count (works for runs that have no summary yet)."""
    from ..model.presets import load_preset
    from ..model.accounting import model_stats

    try:
        return model_stats(load_preset(model)).total_params
    except ValueError:
        return 0


_INTS = {"seed", "total_params", "nonembedding_params", "block_params", "tokens", "world_size"}
_FLOATS = {"flops", "final_train_loss", "final_val_loss", "wall_time_s", "unigram_loss", "bigram_loss",
           "lambda_min", "lambda_lowest"}
_BOOLS = {"under_trained", "selected"}


def _parse(key: str, value: str) -> object:
    if value == "" and key in _INTS | _FLOATS | _BOOLS:
        return None
    if key in _BOOLS:
        return value == "True"
    return int(float(value)) if key in _INTS else float(value) if key in _FLOATS else value


def _axis_cell(value: Any) -> str:
    """An axis value in the CSV: empty for null, JSON for numbers and lists, strings as they are."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def _axis_value(cell: str) -> Any:
    if cell == "":
        return None
    try:
        v = json.loads(cell)
    except json.JSONDecodeError:
        return cell
    return tuple(v) if isinstance(v, list) else v


def axis_names(records: list[RunRecord]) -> list[str]:
    return sorted({k for r in records for k in r.axes})


def to_csv(records: list[RunRecord]) -> str:
    """One row per run: the RunRecord fields, then one column per axis named by its dotted key."""
    axes = axis_names(records)
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS + axes, lineterminator="\n")
    writer.writeheader()
    for r in records:
        row = {k: v for k, v in asdict(r).items() if k != "axes"}
        writer.writerow({**row, **{k: _axis_cell(r.axes.get(k)) for k in axes}})
    return out.getvalue()


def read_csv(path: str | Path) -> list[RunRecord]:
    """The table `to_csv` wrote, typed again (columns that are no RunRecord field are axes)."""
    with open(path, newline="") as f:
        return [RunRecord(**{k: _parse(k, v) for k, v in row.items() if k in COLUMNS},
                          axes={k: _axis_value(v) for k, v in row.items() if k not in COLUMNS})
                for row in csv.DictReader(f)]


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


def _axis_label(key: str, value: Any, varies: bool) -> str:
    """A null that never changes within the row's arch is "-" (not applicable: a Transformer's λ_init)."""
    return "-" if value is None and not varies else value_label(key, value)


def to_markdown(records: list[RunRecord], root: str | Path = "", select: Optional[str] = DEFAULT_SELECT) -> str:
    """The runs table (axes by short label; `*` marks the runs at their group's best-of-grid value, `under-trained`
    those that do not beat the bigram), then the best-of-grid table and its warnings, and what the baselines are."""
    from ..scaling.baselines import BASELINES_NOTE

    axes = axis_names(records)
    cols = ["model", "arch", "seed", "total_params", "block_params", "tokens", "flops", "final_train_loss",
            "final_val_loss", "unigram_loss", "bigram_loss", "lambda_min", "lambda_lowest", "wall_time_s", "status"]
    head = cols[:3] + [short_label(k) for k in axes] + cols[3:]
    varies = {a: {k for k in axes if len({repr(r.axes.get(k)) for r in records if r.arch == a}) > 1}
              for a in {r.arch for r in records}}
    lines = ["| " + " | ".join(head) + " | selected | run_dir |", "|" + "---|" * (len(head) + 2)]
    for r in records:
        d = asdict(r)
        cells = [_cell(c, d[c]) for c in cols[:3]]
        cells += [_axis_label(k, r.axes.get(k), k in varies[r.arch]) for k in axes]
        cells += [_cell(c, d[c]) for c in cols[3:]]
        if r.under_trained:
            cells[-1] += " (under-trained)"
        lines.append("| " + " | ".join(cells) + f" | {'*' if r.selected else ''} | {_rel(r.run_dir, root)} |")
    sel = select_runs(records, select)
    if sel.select:
        lines += [""] + choices_markdown(selection_dict(sel))
    if any(r.bigram_loss is not None for r in records):
        lines += ["", BASELINES_NOTE]
    return "\n".join(lines) + "\n"


def write_tables(records: list[RunRecord], root: str | Path, out: str | Path,
                 select: Optional[str] = DEFAULT_SELECT) -> tuple[Path, Path]:
    """runs.csv and runs.md under `out`; best-of-grid edge warnings also go to stderr."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "runs.csv", out / "runs.md"
    csv_path.write_text(to_csv(records))
    md_path.write_text(to_markdown(records, root, select))
    for w in select_runs(records, select).warnings:
        print(f"warning: {w}", file=sys.stderr)
    return csv_path, md_path
