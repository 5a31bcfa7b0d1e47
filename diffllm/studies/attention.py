"""The attention-family comparison (configs/sweep/micro-attn*.yaml, docs/micro-attention.md): one table of quality
against inference cost for MHA, GQA, MLA, Diff, Diff-GQA and Diff V2 at each size.

Two collected sweeps, each after `diffllm sweep collect` marked the reported runs (`selected`: e.g. the report seeds
at the lr chosen on tuning seeds, select_protocol=split): a language-model half (`lm`: the validation loss, `diffllm
eval ppl`'s number over the whole held-out set where eval/ppl.json exists, else the run's final_val_loss) and a recall
half (`recall`: `diffllm eval recall`'s mean accuracy where eval/recall.json exists, else the in-loop one). Per
(attention, size): block parameters and the KV cache per token (bf16, all layers: the variant's own declaration), the
mean of each metric with a 95% t-interval over seeds, and its seed-paired difference to MHA (the Transformer with as
many kv heads as heads). Writes <out>/attention.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..config import run_key_values
from ..errors import UserError
from ..model.accounting import kv_cache_bytes_per_token
from ..model.config import ModelConfig
from ..model.registry import baseline, variants
from ..results import RunRecord
from ..runs import Run
from ..scaling.select import size_of
from .common import LR, emit, eval_json, fmt_ci, folder_of, read_records

MHA = "mha"  # the row every other is paired against


@dataclass
class Config:
    """One table of val loss, recall accuracy and KV cache per token across attentions (docs/micro-attention.md)."""

    lm: str = ""  # the language-model sweep: its collected runs.csv (reported runs marked) or its directory
    recall: str = ""  # the recall sweep (data=recall), likewise; empty: the table has no recall columns
    out: Optional[str] = None  # the folder for attention.md (default: the lm sweep's folder)


@dataclass(frozen=True)
class Row:
    """What a run is, for the table: its attention (arch, and -gqa where it has fewer kv heads than heads), its size
    (the preset's size without the -gqa suffix, so that a size's rows line up) and its cost."""

    attention: str
    size: str
    block_params: int
    kv_bytes: int


def describe(r: RunRecord) -> Row:
    config = Run(Path(r.run_dir)).config()
    if not config or "model" not in config:
        raise UserError(f"{r.run_dir}: no config.yaml with a model section (is this a diffllm run directory?)")
    cfg = ModelConfig(**config["model"])
    kv_heads = cfg.n_kv_heads or cfg.n_heads
    grouped = kv_heads < cfg.n_heads
    name = MHA if cfg.arch == baseline().arch and not grouped else cfg.arch + ("-gqa" if grouped else "")
    size = re.sub(r"-gqa$", "", size_of(r.model, r.arch))
    return Row(name, size, r.block_params or 0, kv_cache_bytes_per_token(cfg))


def reported(source: str, key: str) -> dict[Row, list[RunRecord]]:
    """(attention, size) -> the reported (selected) finished runs of `source`, by seed."""
    records = read_records(source, key)
    runs = [r for r in records if r.selected and r.status == "finished"]
    if not runs:
        raise UserError(
            f"{key}={source}: no reported run (collect it first: diffllm sweep collect sweep_dir=... "
            "select_protocol=split select_seeds=[...] report_seeds=[...])"
        )
    out: dict[Row, list[RunRecord]] = defaultdict(list)
    for r in runs:
        out[describe(r)].append(r)
    return {row: sorted(rs, key=lambda r: r.seed) for row, rs in out.items()}


def val_loss(r: RunRecord) -> float:
    ev = eval_json(r, "ppl.json")
    return (
        sum(s["loss"] * s["tokens"] for s in ev["sources"].values()) / sum(s["tokens"] for s in ev["sources"].values())
        if ev
        else r.final_val_loss
    )


def recall_acc(r: RunRecord) -> float:
    ev = eval_json(r, "recall.json")
    return ev["mean"] if ev else r.recall_acc


def cells(rows: dict[Row, list[RunRecord]], row: Row, metric: Callable, base: dict) -> list[str]:
    """lr, mean [CI], and the seed-paired difference to MHA at the row's size: a half's three cells."""
    rs = rows.get(row)
    if not rs:
        return ["-", "-", "-"]
    values = {r.seed: metric(r) for r in rs}
    ref = base.get(row.size, {})
    paired = [v - ref[s] for s, v in values.items() if s in ref]
    lrs = sorted({r.axes.get(LR) for r in rs}, key=lambda v: (v is None, v))
    diff = "-" if row.attention == MHA or not paired else f"{fmt_ci(paired, 4)} (n={len(paired)})"
    return ["/".join("-" if v is None else f"{v:g}" for v in lrs), f"{fmt_ci(list(values.values()), 4)}", diff]


def table(lm: dict[Row, list], rec: dict[Row, list]) -> list[str]:
    def by_size(rows: dict[Row, list], metric: Callable) -> dict:
        return {row.size: {r.seed: metric(r) for r in rs} for row, rs in rows.items() if row.attention == MHA}

    lm_base, rec_base = by_size(lm, val_loss), by_size(rec, recall_acc)
    mha_kv = {row.size: row.kv_bytes for row in {**lm, **rec} if row.attention == MHA}
    lines = [
        "| attention | size | block params | KV bytes/token | KV / MHA | lr (LM) | val loss [95% CI] | "
        "minus MHA, seed-paired [95% CI] | lr (recall) | recall acc [95% CI] | minus MHA, seed-paired [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    archs = list(variants())  # rows in the registry's order: MHA first, each arch beside its -gqa row

    def rank(r: Row) -> tuple:
        arch = r.attention.removesuffix("-gqa")
        return (r.size, r.attention != MHA, archs.index(arch) if arch in archs else len(archs), r.attention)

    rows = sorted({**lm, **rec}, key=rank)
    for row in rows:
        ratio = f"{row.kv_bytes / mha_kv[row.size]:.2f}" if row.size in mha_kv else "-"
        lines.append(
            f"| {row.attention} | {row.size} | {row.block_params:,} | {row.kv_bytes:,} | {ratio} | "
            + " | ".join(cells(lm, row, val_loss, lm_base) + cells(rec, row, recall_acc, rec_base))
            + " |"
        )
    return lines


def seeds_line(name: str, rows: dict[Row, list]) -> str:
    seeds = sorted({r.seed for rs in rows.values() for r in rs})
    return f"- {name}: {sum(len(rs) for rs in rows.values())} reported runs, seeds {seeds}"


def run(c: Config) -> str:
    """Write <out>/attention.md; returns its text."""
    lm = reported(c.lm, "lm")
    rec = reported(c.recall, "recall") if c.recall else {}
    out = Path(c.out) if c.out else folder_of(c.lm)
    sources = [seeds_line("language model (val loss: eval ppl over the whole held-out set where run)", lm)]
    if rec:
        sources.append(seeds_line("recall (accuracy: eval recall where run, else the last in-loop value)", rec))
    text = "\n".join(
        ["Quality against KV cache per attention and size (means over seeds, 95% t-intervals):", ""]
        + table(lm, rec)
        + [""]
        + sources
    )
    return emit(text + "\n", out / "attention.md")


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study attention", Config, run, argv)
