"""`diffllm sweep collect`: every run's summary.json under a sweep directory -> one table (CSV + markdown).
Runs without a summary are listed as unfinished, never dropped."""
from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

import yaml

from ..runs import METRICS_FILE, SUMMARY_FILE, Run


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


COLUMNS = [f.name for f in fields(RunRecord)]


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


def read_run(run_dir: Path) -> RunRecord:
    run = Run(run_dir)
    s = run.summary() or {}  # a damaged summary.json: a one-line ValueError naming it
    model = s.get("model") or _preset_in_path(run_dir)
    return RunRecord(
        run_dir=str(run_dir), model=model, arch=s.get("arch") or _preset_arch(model),
        seed=_seed(s, run), total_params=s.get("total_params"), nonembedding_params=s.get("nonembedding_params"),
        block_params=block_params(model, s.get("total_params"), s.get("nonembedding_params")),
        tokens=s.get("tokens"), flops=s.get("flops"), final_train_loss=s.get("final_train_loss"),
        final_val_loss=s.get("final_val_loss"), wall_time_s=s.get("wall_time_s"), world_size=s.get("world_size"),
        status=s.get("status", "unfinished") if s else "unfinished",
    )


def run_dirs(root: Path) -> list[Path]:
    """Directories holding a run: a summary.json, a metrics.jsonl or a checkpoints/ folder."""
    marks = (SUMMARY_FILE, METRICS_FILE, "checkpoints")
    found = {p.parent for m in marks for p in root.rglob(m) if "checkpoints" not in p.parent.parts}
    return sorted(found)


def collect(root: str | Path) -> list[RunRecord]:
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"sweep_dir={root}: no such directory")
    records = [read_run(d) for d in run_dirs(root)]
    if not records:
        raise ValueError(f"sweep_dir={root}: no runs found (no summary.json, metrics.jsonl or checkpoints/ below)")
    return sorted(records, key=lambda r: (r.arch, _preset_size(r.model), r.tokens or 0, r.seed or 0, r.run_dir))


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


def to_csv(records: list[RunRecord]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(asdict(r) for r in records)
    return out.getvalue()


_INTS = {"seed", "total_params", "nonembedding_params", "block_params", "tokens", "world_size"}
_FLOATS = {"flops", "final_train_loss", "final_val_loss", "wall_time_s"}


def _parse(key: str, value: str) -> object:
    if value == "" and (key in _INTS or key in _FLOATS):
        return None
    return int(float(value)) if key in _INTS else float(value) if key in _FLOATS else value


def read_csv(path: str | Path) -> list[RunRecord]:
    """The table `to_csv` wrote, typed again."""
    with open(path, newline="") as f:
        return [RunRecord(**{k: _parse(k, v) for k, v in row.items()}) for row in csv.DictReader(f)]


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


def to_markdown(records: list[RunRecord], root: str | Path = "") -> str:
    cols = ["model", "arch", "seed", "total_params", "block_params", "tokens", "flops", "final_train_loss",
            "final_val_loss", "wall_time_s", "status"]
    lines = ["| " + " | ".join(cols) + " | run_dir |", "|" + "---|" * (len(cols) + 1)]
    for r in records:
        d = asdict(r)
        rel = str(Path(r.run_dir).relative_to(root)) if root and Path(r.run_dir).is_relative_to(root) else r.run_dir
        lines.append("| " + " | ".join(_cell(c, d[c]) for c in cols) + f" | {rel} |")
    return "\n".join(lines) + "\n"


def write_tables(records: list[RunRecord], root: str | Path, out: str | Path) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "runs.csv", out / "runs.md"
    csv_path.write_text(to_csv(records))
    md_path.write_text(to_markdown(records, root))
    return csv_path, md_path
