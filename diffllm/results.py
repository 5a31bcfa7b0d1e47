"""Run records of many runs: every run directory under a folder read into one `RunRecord` (its summary, its axes,
its Kaplan N from its own saved model config), and the runs.csv they round-trip through. `diffllm sweep collect`
tabulates them (diffllm/sweep/collect.py); `diffllm scaling fit` analyses them (diffllm/scaling/).

A run's *axes* are the dotted config keys (config.yaml) whose values differ between the runs of its (model, tokens)
group, bookkeeping left out (run_dir, seeds, resume, paths). The reference baselines and the best-of-grid flag are
filled in by their owners (diffllm/scaling/baselines.py `add_baselines`, diffllm/scaling/select.py `mark_selected`).
This module imports nothing of train/, sweep/ or scaling/."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from .errors import UserError
from .runs import METRICS_FILE, SUMMARY_FILE, Run, read_metrics


@dataclass
class RunRecord:
    run_dir: str
    model: str
    arch: str
    seed: Optional[int]
    total_params: Optional[int]
    nonembedding_params: Optional[int]
    block_params: Optional[int]  # non-embedding minus an untied output head: Kaplan's N (of the run's own config)
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
    spikes: Optional[int] = None  # loss / grad-norm spikes detected (trainer.spikes; summary.json)
    skipped_steps: Optional[int] = None  # updates dropped: non-finite steps and skipped spikes
    max_grad_norm: Optional[float] = None  # the largest pre-clip global grad norm of any step
    act_max: Optional[float] = None  # the largest |activation| of any block output at any logged step (telemetry)
    attn_logit_max: Optional[float] = None  # the largest |q k^T / sqrt(d)| of any layer at any logged step
    recall_acc: Optional[float] = None  # in-loop associative recall (trainer.eval.recall_n): the last accuracy
    recall_step_50: Optional[int] = None  # ... the first evaluated step at which it reached 0.5 (None: never)
    recall_step_90: Optional[int] = None  # ... and 0.9
    branch_parent: Optional[str] = None  # a WSD cooldown: its parent's run_dir (branch.json)
    branch_tokens: Optional[int] = None  # ... and the tokens it shares with the parent (trained once, by the parent)
    branch_wall_s: Optional[float] = (
        None  # ... and the parent's wall time up to the branch (in the cooldown's wall_time_s)
    )
    kn3_loss: Optional[float] = None  # interpolated Kneser-Ney 3-gram, same windows (scaling/kneser_ney.py)
    kn4_loss: Optional[float] = None  # ... 4-gram
    axes: dict = field(default_factory=dict)  # dotted config key -> value, for every axis of the sweep


COLUMNS = [f.name for f in fields(RunRecord) if f.name != "axes"]
BOOKKEEPING = {
    "run_dir",
    "seed",
    "data.seed",
    "trainer.resume",
    "model.name",
    "data.tokenizer.path",
    "model.init_from",
    "data.prepared_dir",
    "logging.name",
    "logging.tags",
    "trainer.branch_budgets",
}
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


def _seed(summary: dict, run: Run, config: dict) -> Optional[int]:
    if summary.get("seed") is not None:
        return int(summary["seed"])
    if config.get("seed") is not None:
        return int(config["seed"])
    m = re.search(r"seed(\d+)", run.dir.name)
    return int(m.group(1)) if m else None


def kaplan_n(stats, tied: bool) -> int:
    """Kaplan's N from a ModelStats: non-embedding parameters without the output head (an untied head is the size of
    the embedding table; a tied one is the table itself, already left out)."""
    return stats.nonembedding_params - (0 if tied else stats.embedding_params)


def block_params(model_config: Optional[dict]) -> Optional[int]:
    """Kaplan's N of the model a run saved in its config.yaml (None without one, or one this diffllm cannot read)."""
    counted = saved_model_stats(model_config) if model_config else None
    return kaplan_n(*counted) if counted else None


def saved_model_stats(model_config: dict, seq_len: Optional[int] = None) -> Optional[tuple[Any, bool]]:
    """(ModelStats at seq_len, tie_embeddings) of the model config a run saved; None for one this diffllm cannot
    build (another version's). Counted once per config: a sweep's runs share a few models."""
    return _counted(json.dumps(model_config, sort_keys=True, default=str), seq_len)


@functools.cache
def _counted(model_json: str, seq_len: Optional[int]) -> Optional[tuple[Any, bool]]:
    from .config import build
    from .model.accounting import model_stats
    from .model.config import ModelConfig

    try:
        cfg = build(ModelConfig, json.loads(model_json), "model")
        return model_stats(cfg, seq_len), cfg.tie_embeddings
    except (ValueError, TypeError):  # a config of another diffllm version, or a model this one cannot build
        return None


def _preset_in_path(run_dir: Path) -> str:
    """A run without a summary yet: the preset named by a folder on its path (sweeps use <model>/<tokens>/seed<s>)."""
    from .model.presets import preset_names

    names = set(preset_names())
    return next((part for part in reversed(run_dir.parts) if part in names), run_dir.name)


def metrics_stats(run_dir: Path) -> dict:
    """From the run's metrics.jsonl records (the trainer's diagnostics, diffllm/train/diagnostics.py): lambda_min at
    the last record and its lowest (Diff); the largest act_max/<i> and attn_logit_max/<i> of any record and layer;
    the in-loop recall accuracy (eval/recall/acc, diffllm/train/eval_hook.py) at its last evaluation and the first
    steps at which it reached 0.5 and 0.9. None where no record has the value."""
    records = read_metrics(run_dir)
    lambdas = [r["lambda_min"] for r in records if r.get("lambda_min") is not None]
    recall = [(r.get("step"), r["eval/recall/acc"]) for r in records if r.get("eval/recall/acc") is not None]

    def first_step(level: float) -> Optional[int]:
        return next((step for step, acc in recall if acc >= level), None)

    def largest(prefix: str) -> Optional[float]:
        values = [v for r in records for k, v in r.items() if k.startswith(prefix) and v is not None]
        return max(values) if values else None

    return {
        "lambda_min": lambdas[-1] if lambdas else None,
        "lambda_lowest": min(lambdas) if lambdas else None,
        "act_max": largest("act_max/"),
        "attn_logit_max": largest("attn_logit_max/"),
        "recall_acc": recall[-1][1] if recall else None,
        "recall_step_50": first_step(0.5),
        "recall_step_90": first_step(0.9),
    }


def read_run(run_dir: Path) -> RunRecord:
    """One run's summary (axes are filled in by `collect`, which sees the other runs)."""
    run = Run(run_dir)
    s = run.summary() or {}  # a damaged summary.json: a one-line ValueError naming it
    config = run.config() or {}
    branch = s.get("branch") or run.branch() or {}
    model = s.get("model") or _preset_in_path(run_dir)
    return RunRecord(
        run_dir=str(run_dir),
        model=model,
        arch=s.get("arch") or _preset_arch(model),
        seed=_seed(s, run, config),
        total_params=s.get("total_params"),
        nonembedding_params=s.get("nonembedding_params"),
        block_params=block_params(config.get("model")),
        tokens=s.get("tokens"),
        flops=s.get("flops"),
        final_train_loss=s.get("final_train_loss"),
        final_val_loss=s.get("final_val_loss"),
        wall_time_s=s.get("wall_time_s"),
        world_size=s.get("world_size"),
        status=s.get("status", "unfinished") if s else "unfinished",
        **metrics_stats(run_dir),
        spikes=s.get("spikes"),
        skipped_steps=s.get("skipped_steps"),
        max_grad_norm=s.get("max_grad_norm"),
        branch_parent=branch.get("parent"),
        branch_tokens=branch.get("tokens"),
        branch_wall_s=branch.get("parent_elapsed_s"),
    )


def run_dirs(root: Path) -> list[Path]:
    """Directories holding a run: a summary.json, a metrics.jsonl or a checkpoints/ folder."""
    marks = (SUMMARY_FILE, METRICS_FILE, "checkpoints")
    found = {p.parent for m in marks for p in root.rglob(m) if "checkpoints" not in p.parent.parts}
    return sorted(found)


def collect(root: str | Path) -> list[RunRecord]:
    """Every run under `root` with its axes, sorted by arch, preset size, budget, seed and directory."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"sweep_dir={root}: no such directory")
    records = [read_run(d) for d in run_dirs(root)]
    if not records:
        raise UserError(f"sweep_dir={root}: no runs found (no summary.json, metrics.jsonl or checkpoints/ below)")
    flats = {r.run_dir: flatten(Run(r.run_dir).config() or {}) for r in records}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if flats[r.run_dir]:
            groups[(r.model, r.tokens)].append(flats[r.run_dir])
    axes = find_axes(groups)
    if WIDTH_KEY not in axes and _off_preset_width(records, flats):
        axes = sorted([*axes, WIDTH_KEY])
    for r in records:
        r.axes = {k: flats[r.run_dir].get(k) for k in axes}
    return sorted(records, key=lambda r: (r.arch, _preset_size(r.model), r.tokens or 0, r.seed or 0, r.run_dir))


WIDTH_KEY = "model.d_model"


def _off_preset_width(records: list[RunRecord], flats: dict[str, dict]) -> bool:
    """Whether some run trained at a width its preset does not have (a tuning grid's one `model.d_model`, e.g. μP's base
    width): kept as an axis though it never varies, or the run would read as its preset's width."""
    from .model.presets import load_preset, preset_names

    names, widths = set(preset_names()), {}
    for r in records:
        d = flats[r.run_dir].get(WIDTH_KEY)
        if d is not None and r.model in names:
            widths.setdefault(r.model, load_preset(r.model).d_model)
            if d != widths[r.model]:
                return True
    return False


def _shares_prefix(r: RunRecord, present: set) -> bool:
    """A WSD cooldown whose parent is among the records (that parent trained the shared prefix)."""
    return bool(r.branch_parent and r.branch_tokens and r.tokens and str(Path(r.branch_parent).resolve()) in present)


def trained_compute(records: list[RunRecord]) -> tuple[int, float]:
    """(tokens, FLOPs) the runs trained together: each run's own count, less the prefix a WSD cooldown shares with a
    parent that is among `records` (that parent counted it: branch_tokens x the cooldown's FLOPs per token)."""
    present = {str(Path(r.run_dir).resolve()) for r in records}
    tokens, flops = 0, 0.0
    for r in records:
        t, f = r.tokens or 0, r.flops or 0.0
        if _shares_prefix(r, present):
            t, f = t - r.branch_tokens, f * (t - r.branch_tokens) / t
        tokens, flops = tokens + t, flops + f
    return tokens, flops


def trained_wall(records: list[RunRecord]) -> Optional[tuple[float, float]]:
    """(measured, from scratch) wall seconds of the runs, or None where no WSD cooldown shares a parent here, or a
    time is missing. Measured: each run's wall_time_s, a cooldown's less its parent's time up to the branch
    (branch_wall_s). From scratch: every run's budget at the time per token its family's parent (a run's own, for a
    run with no cooldown here) measured: the same timings, priced as if no prefix were shared."""
    present = {str(Path(r.run_dir).resolve()) for r in records}
    cooldowns = [r for r in records if _shares_prefix(r, present)]
    if (
        not cooldowns
        or any(r.wall_time_s is None or not r.tokens for r in records)
        or any(r.branch_wall_s is None for r in cooldowns)
    ):
        return None
    per_token = {str(Path(r.run_dir).resolve()): r.wall_time_s / r.tokens for r in records}
    measured = sum(r.wall_time_s for r in records) - sum(r.branch_wall_s for r in cooldowns)
    scratch = sum(
        r.tokens * per_token[str(Path(r.branch_parent).resolve()) if r in cooldowns else str(Path(r.run_dir).resolve())]
        for r in records
    )
    return measured, scratch


@functools.cache
def _preset_arch(model: str) -> str:
    """A run without a summary yet: the arch its preset names ("unknown" for a name that is no preset)."""
    from .model.presets import load_preset

    try:
        return load_preset(model).arch
    except ValueError:
        return "unknown"


@functools.cache
def _preset_size(model: str) -> int:
    """Sort key: the preset's parameter count (works for runs that have no summary yet)."""
    from .model.accounting import model_stats
    from .model.presets import load_preset

    try:
        return model_stats(load_preset(model)).total_params
    except ValueError:
        return 0


# ------------------------------------------------------------------------------------------------------- runs.csv
_INTS = {
    "seed",
    "total_params",
    "nonembedding_params",
    "block_params",
    "tokens",
    "world_size",
    "spikes",
    "skipped_steps",
    "branch_tokens",
    "recall_step_50",
    "recall_step_90",
}
_FLOATS = {
    "flops",
    "final_train_loss",
    "final_val_loss",
    "wall_time_s",
    "unigram_loss",
    "bigram_loss",
    "kn3_loss",
    "kn4_loss",
    "lambda_min",
    "lambda_lowest",
    "max_grad_norm",
    "act_max",
    "attn_logit_max",
    "branch_wall_s",
    "recall_acc",
}
_BOOLS = {"under_trained", "selected"}


def _parse(key: str, value: str) -> object:
    if value == "" and key in _INTS | _FLOATS | _BOOLS | {"branch_parent"}:
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


PATHS = ("run_dir", "branch_parent")  # run paths: runs.csv holds them relative to its own folder


def to_csv(records: list[RunRecord], folder: Optional[str | Path] = None) -> str:
    """One row per run: the RunRecord fields, then one column per axis named by its dotted key. `folder`: where the
    CSV is written; its run paths are then relative to it (a sweep's runs.csv: relative to the sweep), so that the
    sweep folder can move or be copied with its table."""
    axes = axis_names(records)
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS + axes, lineterminator="\n")
    writer.writeheader()
    for r in records:
        row = {k: v for k, v in asdict(r).items() if k != "axes"}
        if folder is not None:
            row.update({k: relative(row[k], folder) for k in PATHS if row[k]})
        writer.writerow({**row, **{k: _axis_cell(r.axes.get(k)) for k in axes}})
    return out.getvalue()


def relative(path: str, folder: str | Path) -> str:
    """A run path as a committed table holds it: relative to the table's folder, not this machine's."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(folder))


def _located(path: str, folder: str) -> str:
    """A run path of a runs.csv in `folder`: relative ones are relative to that folder; absolute ones (older tables)
    stay; an older table's path relative to the working directory is taken as such where only it exists."""
    if not path or os.path.isabs(path):
        return path
    here = os.path.normpath(os.path.join(folder, path))
    return os.path.abspath(path) if not os.path.exists(here) and os.path.exists(path) else here


def read_csv(path: str | Path) -> list[RunRecord]:
    """The table `to_csv` wrote, typed again (columns that are no RunRecord field are axes), its run paths absolute
    (resolved against the CSV's folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row.update({k: _located(row[k], folder) for k in PATHS if row.get(k)})
    return [
        RunRecord(
            **{k: _parse(k, v) for k, v in row.items() if k in COLUMNS},
            axes={k: _axis_value(v) for k, v in row.items() if k not in COLUMNS},
        )
        for row in rows
    ]
