"""The outlier and quantisation study (issue 33 §3, the paper's Table 5 and Figure 8): tables from a sweep's selected
runs after `diffllm eval outliers` has run on each (its <run>/eval/outliers.json).

Runs: those at their best-of-grid value (scaling.select.select_runs, as `study needle`), and of each (series, size)
the largest budget. Per (series, size), the mean and 95% t-interval over seeds of the top-1 attention logit and the
top-1 hidden state, the loss at fp32 and at each quantised width of the attention logits, and the plays_cloze accuracy
at each width. Against the Transformer, seed-paired (the same seed and size): the ratio of the top-1 logit and of
the top-1 hidden state (below 1: smaller outliers than the Transformer's), and the difference of the loss and of the
accuracy at each width (series minus Transformer). Writes <out>/outliers.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..config import run_key_values
from ..errors import UserError
from ..model.registry import baseline
from .common import by_size, chosen_runs, emit, eval_json, fmt_ci, folder_of, read_records

RESULTS = "outliers.json"


@dataclass
class Config:
    """Outlier and quantisation tables (per arch x size, t-intervals over seeds, seed-paired against the Transformer)
    from a sweep's selected runs after eval outliers has run on each."""

    sweep_dir: str = ""  # the sweep directory (or its collected runs.csv, whose run_dir paths hold the eval results)
    out: Optional[str] = None  # the folder for outliers.md (default: the sweep's folder)


def results(chosen: dict) -> dict[str, dict]:
    """run_dir -> its eval outliers results; a run without them is a one-line UserError naming it and the command."""
    res = {r.run_dir: eval_json(r, RESULTS) for rs in chosen.values() for r in rs}
    missing = [run for run, ev in res.items() if ev is None]
    if missing:
        more = f" (and {len(missing) - 1} other selected run(s))" if len(missing) > 1 else ""
        raise UserError(
            f"{missing[0]}: no eval outliers results ({RESULTS} in its eval/){more}; "
            f"run `diffllm eval outliers run={missing[0]}` on each selected run first"
        )
    return res


Metric = Callable[[dict], Optional[float]]  # one number of a run's outliers.json (None: not measured)


def top1(kind: str) -> Metric:
    return lambda ev: ev[kind]["top1"]


def at_width(part: str, width: str) -> Metric:
    return lambda ev: (ev.get(part) or {}).get(width)


def widths(res: dict, part: str) -> list[str]:
    """fp32 then the quantised widths (widest first) that some run measured `part` at."""
    found = {w for ev in res.values() for w in (ev.get(part) or {})}
    return sorted(found, key=lambda w: (w != "fp32", -int(w) if w != "fp32" else 0))


PAIRED = {"ratio": (lambda a, b: a / b, "/"), "difference": (lambda a, b: a - b, "-")}


def table(chosen: dict, res: dict, columns: list[tuple[str, Metric, int]], paired: Optional[str] = None) -> list[str]:
    """One row per (series, size): each column's mean [95% t-interval] over seeds; with `paired` ("ratio": series /
    Transformer, "difference": series - Transformer), that per seed against the Transformer run of the same size and
    seed instead, one row per series other than the Transformer."""
    ref = baseline().arch
    head = [name if paired is None else f"{name} {PAIRED[paired][1]} Transformer" for name, _, _ in columns]
    lines = ["| series | size | tokens | seeds | " + " | ".join(head) + " |", "|---|---|---|---|" + "---|" * len(head)]
    for (series, size), rs in by_size(chosen):
        if paired is not None and series == ref:
            continue
        base = {r.seed: res[r.run_dir] for r in chosen.get((ref, size), [])}
        cells = []
        for _, metric, digits in columns:
            if paired is None:
                xs = [metric(res[r.run_dir]) for r in rs]
            else:
                pair = [(metric(res[r.run_dir]), metric(base[r.seed])) for r in rs if r.seed in base]
                xs = [PAIRED[paired][0](x, y) for x, y in pair if x is not None and y is not None]
                digits = 3 if paired == "ratio" else digits
            xs = [x for x in xs if x is not None]
            cells.append(f"{fmt_ci(xs, digits)}" + (f" (n={len(xs)})" if paired else "") if xs else "-")
        lines.append(f"| {series} | {size} | {rs[0].tokens or 0:,} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def section(chosen: dict, res: dict, title: str, columns: list, paired: str) -> list[str]:
    """A table of the values and one of the seed-paired comparisons to the Transformer."""
    what = "ratio (series / Transformer)" if paired == "ratio" else "difference (series minus Transformer)"
    return [
        f"{title}, mean [95% t-interval] over seeds:",
        "",
        *table(chosen, res, columns),
        "",
        f"Seed-paired {what}, mean [95% t-interval] over the seeds both have (n):",
        "",
        *table(chosen, res, columns, paired),
    ]


def run(c: Config) -> str:
    """Write <out>/outliers.md from the selected runs' eval outliers results; returns its text."""
    chosen = chosen_runs(read_records(c.sweep_dir, "sweep_dir", baselines=False))
    if not chosen:
        raise UserError(f"sweep_dir={c.sweep_dir}: no finished run at a best-of-grid value")
    res = results(chosen)
    top = [("top-1 logit", top1("attention_logits"), 2), ("top-1 hidden", top1("hidden_states"), 2)]
    parts = [section(chosen, res, "Top-1 |attention logit| and |hidden state| (eval outliers)", top, "ratio")]
    for part, what, digits in (
        ("quantised_loss", "Held-out loss (nats/token)", 4),
        ("quantised_accuracy", "plays_cloze accuracy (chance 0.25)", 3),
    ):
        cols = [(w if w == "fp32" else f"{w}-bit", at_width(part, w), digits) for w in widths(res, part)]
        if cols:
            title = f"{what} with every attention map's logits absmax-quantised to each width"
            parts.append(section(chosen, res, title, cols, "difference"))
    text = "\n\n".join("\n".join(p) for p in parts) + "\n"
    out = Path(c.out) if c.out else folder_of(c.sweep_dir)
    return emit(text, out / "outliers.md")


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study outliers", Config, run, argv)
