"""The micro study of the paper's long-context and many-shot in-context-learning claims (issue 33 §4): tables from a
sweep's selected runs after `diffllm eval ppl by_position=true` and `diffllm eval icl` have run on each (their
<run>/eval/ppl_by_position.json and icl-<task>.json).

Runs: those `study outliers` takes (best-of-grid value; of each series and size, the largest budget). NLL by position,
per size and source: for each bucket of positions the eval wrote (1, 2-3, 4-7, ...; a bucket reaching past the
training length is extrapolation), the mean over seeds of the bucket's NLL and of the cumulative average NLL at the
bucket's end, with a 95% t-interval, and each series' seed-paired difference to the Transformer (same size and seed);
per series, the mean NLL over the positions within the training length and over those past it, paired likewise. ICL,
per size: accuracy by k (a run's `max` is the concrete k it resolved to, and runs are grouped by that k), and the
order robustness (spread: max - min of the accuracy over the P orders, and its std), likewise. A run without one of
the results is one line of the header; a result that no run has is a one-line error naming its command. Writes
<out>/claims.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..config import run_key_values
from ..errors import UserError
from ..model.registry import baseline, variants
from .common import chosen_runs, emit, eval_json, fmt_ci, folder_of, read_records

PPL = "ppl_by_position.json"
Values = dict[str, dict[int, float]]  # series -> seed -> one number of that run
BySeries = dict[str, dict[int, dict]]  # series -> seed -> a run's result (at one size)


@dataclass
class Config:
    """NLL by position and many-shot ICL tables (per arch x size, t-intervals over seeds, seed-paired against the
    Transformer) from a sweep's selected runs after eval ppl by_position=true and eval icl have run on each."""

    sweep_dir: str = ""  # the sweep directory (or its collected runs.csv, whose run_dir paths hold the eval results)
    task: str = "synthetic"  # the eval icl task whose results (eval/icl-<task>.json) the ICL tables read
    out: Optional[str] = None  # the folder for claims.md (default: the sweep's folder)


def icl_file(task: str) -> str:
    """eval icl's results file: icl-<the builtin's name, or the task file's stem>.json."""
    return f"icl-{Path(task).stem}.json"


def ppl_command(found: dict) -> str:
    """eval ppl by_position=true as the runs that have results ran it (their most common seq_len)."""
    lens = Counter(res["seq_len"] for res in found.values())
    return "diffllm eval ppl run=<run> by_position=true" + (f" seq_len={lens.most_common(1)[0][0]}" if lens else "")


def icl_command(found: dict, task: str) -> str:
    """eval icl as the first run that has results ran it (its k, concrete, orders and queries)."""
    cmd = "diffllm eval icl run=<run>" + ("" if task == "synthetic" else f" task={task}")
    if found:
        res = next(iter(found.values()))
        ks = ",".join(str(k) for k in res["by_k"])
        cmd += f' "k=[{ks}]" permutations={res["permutations"]} queries={res["queries"]}'
    return cmd


def load(c: Config, chosen: dict) -> tuple[dict, dict, list[str]]:
    """(run_dir -> ppl_by_position.json, run_dir -> icl json with integer k, one line per missing result); a result
    that no chosen run has is a one-line UserError naming the command that writes it."""
    runs = [r for rs in chosen.values() for r in rs]
    ppl = {r.run_dir: ev for r in runs if (ev := eval_json(r, PPL)) is not None}
    icl = {r.run_dir: ev for r in runs if (ev := eval_json(r, icl_file(c.task))) is not None}
    for ev in icl.values():
        ev["by_k"] = {int(k): v for k, v in ev["by_k"].items()}  # JSON keys are strings
    commands = {PPL: ppl_command(ppl), icl_file(c.task): icl_command(icl, c.task)}
    absent = [name for name, found in ((PPL, ppl), (icl_file(c.task), icl)) if not found]
    if absent:
        raise UserError(
            f"sweep_dir={c.sweep_dir}: no selected run has {' or '.join(absent)} in its eval/; run "
            + " and ".join(f"`{commands[name]}`" for name in absent)
            + f" on each of its {len(runs)} selected runs first"
        )
    missing = [
        f"- {r.run_dir}: no {name}; run `{commands[name].replace('<run>', r.run_dir)}`"
        for r in runs
        for name, found in ((PPL, ppl), (icl_file(c.task), icl))
        if r.run_dir not in found
    ]
    return ppl, icl, missing


def series_order(chosen: dict) -> list[str]:
    """The series: the Transformer first, then in the model registry's order (a series label starts with its arch)."""
    archs = list(variants())

    def rank(series: str) -> tuple:
        arch = series.split()[0]
        return (archs.index(arch) if arch in archs else len(archs), series)

    return sorted({series for series, _ in chosen}, key=rank)


def at_size(chosen: dict, results: dict, size: str, get: Callable[[dict], Any] = lambda ev: ev) -> BySeries:
    """series -> seed -> get(result) for the runs of `size` that have a result (and where get gives one)."""
    out: BySeries = {}
    for (series, sz), rs in chosen.items():
        if sz == size:
            got = {r.seed: get(results[r.run_dir]) for r in rs if r.run_dir in results}
            out[series] = {seed: v for seed, v in got.items() if v is not None}
    return out


def pick(runs: BySeries, f: Callable[[dict], Optional[float]]) -> Values:
    return {s: {seed: v for seed, ev in by_seed.items() if (v := f(ev)) is not None} for s, by_seed in runs.items()}


def cell(xs: list[float], seeds: int, digits: int) -> str:
    """mean [95% t-interval] over seeds, with n where fewer than the size's `seeds`; - where none."""
    return "-" if not xs else fmt_ci(xs, digits) + (f" (n={len(xs)})" if len(xs) < seeds else "")


def paired_table(head: str, rows: list[tuple[str, Values]], series: list[str], seeds: int, digits: int) -> list[str]:
    """One row per (label, values): each series' mean [95% t-interval] over seeds, then each other series' seed-paired
    difference to the Transformer; a cell over fewer than `seeds` seeds says its n."""
    ref = baseline().arch if baseline().arch in series else None
    others = [s for s in series if ref and s != ref]

    lines = [
        f"| {head} | " + " | ".join(series + [f"{s} - {ref}" for s in others]) + " |",
        "|---|" + "---|" * (len(series) + len(others)),
    ]
    for label, values in rows:
        cells = [cell(list(values.get(s, {}).values()), seeds, digits) for s in series]
        base = values.get(ref, {})
        cells += [cell([v - base[seed] for seed, v in values.get(s, {}).items() if seed in base], seeds, digits)
                  for s in others]  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def bucket_value(lo: int, hi: int, field: str) -> Callable[[dict], Optional[float]]:
    return lambda src: next((b[field] for b in src["buckets"] if (b["from"], b["to"]) == (lo, hi)), None)


def span_mean(extrapolation: bool) -> Callable[[dict], Optional[float]]:
    """The mean NLL over the positions within the training length (or past it: None where the run has none)."""

    def f(src: dict) -> Optional[float]:
        nll, n = src["nll_by_position"], src["train_seq_len"]
        part = nll[n:] if extrapolation else nll[:n]
        return sum(part) / len(part) if part else None

    return f


def nll_tables(runs: BySeries, series: list[str], seeds: int, where: str) -> list[str]:
    """A size and source's two bucket tables (per-bucket and cumulative NLL) and its in-length/extrapolation lines."""
    ref = baseline().arch
    buckets = sorted({(b["from"], b["to"], b["extrapolation"]) for ev in _each(runs) for b in ev["buckets"]})
    out = []
    for field, what in (("nll", "NLL per bucket"), ("cumulative", "cumulative average NLL at the bucket's end")):
        rows = [
            ((f"{lo}" if lo == hi else f"{lo}-{hi}") + (" extrapolation" if extra else ""), pick(runs, value))
            for lo, hi, extra in buckets
            for value in [bucket_value(lo, hi, field)]
        ]
        out += [f"{where}, {what}:", "", *paired_table("positions", rows, series, seeds, 3), ""]
    n = Counter(ev["train_seq_len"] for ev in _each(runs)).most_common(1)[0][0]
    T = max(len(ev["nll_by_position"]) for ev in _each(runs))
    spans = [(f"1-{min(n, T)}", pick(runs, span_mean(False)))]
    spans += [(f"{n + 1}-{T}", pick(runs, span_mean(True)))] if T > n else []
    out.append(
        f"{where}, mean NLL over positions 1-{min(n, T)} (within the training length, {n})"
        + (f" and {n + 1}-{T} (extrapolation):" if T > n else ":")
    )
    out.append("")
    for s in series:
        parts = []
        for label, values in spans:
            xs, base = values.get(s, {}), values.get(ref, {})
            diffs = [v - base[seed] for seed, v in xs.items() if seed in base]
            paired = f", minus {ref} {cell(diffs, seeds, 3)}" if s != ref and diffs else ""
            parts.append(f"{label}: {cell(list(xs.values()), seeds, 3)}{paired}")
        out.append(f"- {s}: " + "; ".join(parts) if runs.get(s) else f"- {s}: no results")
    return out + [""]


def _each(runs: BySeries):
    return (ev for by_seed in runs.values() for ev in by_seed.values())


def nll_section(chosen: dict, ppl: dict, series: list[str], sizes: list[str]) -> list[str]:
    out = ["## NLL by position", ""]
    for size in sizes:
        found = at_size(chosen, ppl, size)
        sources = list(dict.fromkeys(name for ev in _each(found) for name in ev["sources"]))
        seeds = max(len(rs) for (_, sz), rs in chosen.items() if sz == size)
        for source in sources:

            def get(ev: dict, source=source) -> Optional[dict]:
                src = ev["sources"].get(source)
                return None if src is None else {**src, "train_seq_len": ev["train_seq_len"]}

            runs = {s: by_seed for s, by_seed in at_size(chosen, ppl, size, get).items() if by_seed}
            out += nll_tables(runs, series, seeds, f"{size}, source {source}")
        if not sources:
            out += [f"{size}: no run has NLL-by-position results yet.", ""]
    return out


def uneven_ks(runs: BySeries, ks: list[int], size: str) -> list[str]:
    """A line per k that some runs of the size lack (k=max resolves per run to a concrete k), naming them."""
    total = sum(len(by_seed) for by_seed in runs.values())
    out = []
    for k in ks:
        lacking = [f"{s} seed {seed}" for s, by_seed in runs.items() for seed, ev in by_seed.items()
                   if k not in ev["by_k"]]  # fmt: skip
        if lacking:
            out.append(
                f"- {size}: k={k} in {total - len(lacking)} of {total} runs (not in {', '.join(lacking)}; the runs "
                "differ: k=max resolves per run to the largest k whose every prompt fits)"
            )
    return out


def at_k(k: int, f: Callable[[dict], float]) -> Callable[[dict], Optional[float]]:
    """f of a run's results at k (None where the run has no such k)."""
    return lambda ev: f(ev["by_k"][k]) if k in ev["by_k"] else None


ROBUSTNESS = (("spread (max - min)", lambda r: r["max"] - r["min"]), ("std", lambda r: r["std"]))


def icl_tables(runs: BySeries, series: list[str], seeds: int, size: str) -> list[str]:
    """A size's accuracy by concrete k, then the spread and std over orders at each k with more than one order."""
    ks = sorted({k for ev in _each(runs) for k in ev["by_k"]})
    uneven = uneven_ks(runs, ks, size)
    out = [*uneven, ""] if uneven else []
    acc = [(str(k), pick(runs, at_k(k, lambda r: r["accuracy"]))) for k in ks]
    out += [f"{size}, accuracy by k (demonstrations):", "", *paired_table("k", acc, series, seeds, 3), ""]
    if any(ev["permutations"] > 1 for ev in _each(runs)):
        ordered = [k for k in ks if k > 1]  # 0 or 1 demonstration: one order
        for what, f in ROBUSTNESS:
            rows = [(str(k), pick(runs, at_k(k, f))) for k in ordered]
            title = f"{size}, order robustness: {what} of the accuracy over the orders of the same demonstrations:"
            out += [title, "", *paired_table("k", rows, series, seeds, 3), ""]
    return out


def icl_section(chosen: dict, icl: dict, series: list[str], sizes: list[str]) -> list[str]:
    out = ["## In-context learning", ""]
    for what, key in (("chance", "chance"), ("queries", "queries"), ("orders per k (permutations)", "permutations")):
        seen = sorted({ev[key] for ev in icl.values()})
        out.append(f"- {what}: {', '.join(f'{v:g}' for v in seen)}" + (" (the runs differ)" if len(seen) > 1 else ""))
    out.append("")
    for size in sizes:
        runs = {s: by_seed for s, by_seed in at_size(chosen, icl, size).items() if by_seed}
        seeds = max(len(rs) for (_, sz), rs in chosen.items() if sz == size)
        out += icl_tables(runs, series, seeds, size) if runs else [f"{size}: no run has ICL results yet.", ""]
    return out


def header(c: Config, chosen: dict, records: list, series: list[str], sizes: list[str], missing: list[str]) -> list:
    runs = [r for rs in chosen.values() for r in rs]
    seeds = sorted({r.seed for r in runs})
    tokens = sorted({r.tokens or 0 for r in runs})
    ref = baseline().arch
    left = len(records) - len(runs)
    return [
        "# Study claims: NLL by position and many-shot in-context learning",
        "",
        f"{len(runs)} runs: {', '.join(series)} at {', '.join(sizes)}, seeds {', '.join(map(str, seeds))}; each "
        f"series and size at its best-of-grid value and largest budget ({', '.join(f'{t:,}' for t in tokens)} tokens)"
        + (f"; {left} other run(s) of the sweep (unfinished, or not selected) left out." if left else "."),
        "",
        f"- NLL by position (`diffllm eval ppl by_position=true`, eval/{PPL}): per source, the NLL (nats) of the "
        "token at each position of documents at least seq_len tokens long, averaged over the documents; per bucket "
        "of positions (1, 2-3, 4-7, ...) its mean, and the cumulative average NLL (the mean over positions 1..t) at "
        "the bucket's end; a bucket reaching past the training length is extrapolation (RoPE as trained).",
        f"- ICL (`diffllm eval icl`, eval/{icl_file(c.task)}): the accuracy of k-shot classification (each label "
        "scored by its log-likelihood) over the queries, the mean over the orders of the same k demonstrations; "
        "order robustness: the spread (max - min) and std of that accuracy over the orders, per run.",
        f"- A cell: the mean over seeds [95% t-interval]; `<series> - {ref}`: per seed, the series' value minus the "
        f"{ref}'s at the same size and seed, mean [95% t-interval] over the seeds both have; (n=...) where a cell "
        "has fewer seeds than the size.",
        "",
        *(["Missing results (left out of the tables):", "", *missing, ""] if missing else []),
    ]


def run(c: Config) -> str:
    """Write <out>/claims.md from the selected runs' eval ppl by_position and eval icl results; returns its text."""
    records = read_records(c.sweep_dir, "sweep_dir", baselines=False)
    chosen = chosen_runs(records)
    if not chosen:
        raise UserError(f"sweep_dir={c.sweep_dir}: no finished run at a best-of-grid value")
    ppl, icl, missing = load(c, chosen)
    series, sizes = series_order(chosen), sorted({size for _, size in chosen})
    lines = header(c, chosen, records, series, sizes, missing)
    lines += nll_section(chosen, ppl, series, sizes) + icl_section(chosen, icl, series, sizes)
    out = Path(c.out) if c.out else folder_of(c.sweep_dir)
    return emit("\n".join(lines).rstrip("\n") + "\n", out / "claims.md")


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("study claims", Config, run, argv)
