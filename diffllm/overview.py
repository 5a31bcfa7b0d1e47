"""`diffllm runs [DIR]`: one line per run directory below DIR — model, arch, tokens trained of the budget, status, the
last validation loss and the last checkpoint — read from the run's own files (config.yaml, summary.json,
metrics.jsonl, checkpoints/<latest>/meta.json) without loading torch or a checkpoint's weights.

    $ diffllm runs runs
    run        model             arch         tokens           status       val loss  checkpoint
    diff-tiny  diff-tiny         diff         262,144/262,144  finished     4.812     step64
    t-tiny     transformer-tiny  transformer  131,072/262,144  stopped 50%  5.101     step32

A damaged file in one run makes its row say so (`damaged: <file>`) and the others are still listed."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .counts import parse_count
from .errors import UserError
from .results import run_dirs
from .runs import Run, read_metrics

COLUMNS = ("run", "model", "arch", "tokens", "status", "val loss", "checkpoint")


@dataclass
class RunsConfig:
    """One line per run directory below `dir`: model, arch, tokens trained of the budget, status, the last
    validation loss and the last checkpoint (no checkpoint is loaded)."""

    dir: str = "runs"  # the folder to look in (may be given first, without dir=); every run below it is listed


def _tokens(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _budget(config: dict) -> Optional[int]:
    """The token budget config.yaml asks for (None when it cannot be read)."""
    try:
        return parse_count(config["trainer"]["tokens"], "trainer.tokens")
    except (KeyError, TypeError, UserError):
        return None


def _batch(config: dict) -> Optional[int]:
    try:
        return parse_count(config["trainer"]["global_batch_tokens"], "trainer.global_batch_tokens")
    except (KeyError, TypeError, UserError):
        return None


def _last_val(run_dir: Path) -> Optional[float]:
    values = [r["val_loss"] for r in read_metrics(run_dir) if r.get("val_loss") is not None]
    return values[-1] if values else None


def row(run_dir: Path, root: Path) -> list[str]:
    """The overview's cells for one run directory."""
    name = str(run_dir.relative_to(root)) if run_dir != root else run_dir.name
    try:
        run = Run(run_dir)
        config, summary, latest = run.config() or {}, run.summary() or {}, run.latest()
        val = summary.get("final_val_loss")
        val = _last_val(run_dir) if val is None else val
    except UserError as e:  # one damaged file: this row says which, the listing goes on
        return [name, "", "", "", f"damaged: {str(e).split(':', 1)[0]}", "", ""]
    model = summary.get("model") or config.get("model", {}).get("name", "?")
    arch = summary.get("arch") or config.get("model", {}).get("arch", "?")
    budget, batch = _budget(config), _batch(config)
    trained = summary.get("tokens")
    if trained is None and latest is not None:
        trained = latest.meta.get("tokens", latest.step * batch if batch else None)
    if summary.get("status") == "finished":
        status = "finished"
    elif latest is None:
        status = "no checkpoint"
    elif budget and isinstance(trained, int):
        status = f"stopped {100 * trained // budget}%"
    else:
        status = f"stopped at step {latest.step}"
    return [
        name,
        str(model),
        str(arch),
        f"{_tokens(trained if trained is not None else 0)}/{_tokens(budget)}",
        status,
        f"{val:.3f}" if isinstance(val, (int, float)) else "-",
        latest.tag if latest is not None else "-",
    ]


def table(root: Path) -> str:
    """The overview of every run below `root` (a run directory itself lists as one row)."""
    if not root.is_dir():
        raise UserError(f"dir={root}: no such directory")
    dirs = run_dirs(root)
    if not dirs:
        raise UserError(f"dir={root}: no runs found (no summary.json, metrics.jsonl or checkpoints/ below it)")
    rows = [list(COLUMNS)] + [row(d, root) for d in dirs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main() -> None:
    from .config import run_key_values

    argv = [a if "=" in a or a.startswith("-") else f"dir={a}" for a in sys.argv[1:]]  # `diffllm runs DIR`
    run_key_values("runs", RunsConfig, lambda c: print(table(Path(c.dir))), argv)
