"""`scaling fit predict=<size>@<tokens>`: a prediction made before the runs that test it (issue 32 §4). Each series'
L(N, D) fit gives the final loss of its arch's preset of that size (`<arch>-<size>`, its own N) trained on that many
tokens, with the bootstrap interval of its replicates, and each series' gap to the baseline series with the interval
of the replicate differences (the two series' replicates are independent draws, paired by index). Commit the
report; once the size has trained, `scaling fit holdout=<size>` on the sweep that holds it refits the same runs (same
seeds, same replicates) and scores the same predictions against the measured runs."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Callable, Optional

from ..errors import UserError
from ..model.accounting import model_stats
from ..model.presets import load_preset, preset_names
from ..results import RunRecord, kaplan_n
from .config import parse_predict
from .fit import interval
from .select import size_of


def preset_n(arch: str, size: str, params: str) -> tuple[str, int]:
    """The preset `<arch>-<size>` and its N (block | nonembedding | total parameters)."""
    name = f"{arch}-{size}"
    if name not in preset_names():
        raise UserError(f"predict: no preset {name} (configs/model/{name}.yaml) to predict {arch} at size {size}")
    cfg = load_preset(name)
    s = model_stats(cfg)
    n = {"block": kaplan_n(s, cfg.tie_embeddings), "nonembedding": s.nonembedding_params, "total": s.total_params}
    return name, int(n[params])


def check(spec: Optional[str], archs: set, params: str) -> None:
    """Before anything is fitted: every arch has its preset of the predicted size (a one-line error names one that has
    not); nothing to check without `predict`."""
    for arch in sorted(archs) if spec else ():
        preset_n(arch, parse_predict(spec)[0], params)


def predictions(spec: str, params: str, joint: dict, joint_boot: dict, base: Optional[str], level: float) -> list[dict]:
    """One row per series with an L(N, D) fit: its preset, N, D, the predicted loss [interval] and, but for the
    baseline's row, the gap to the baseline's prediction [interval]."""
    size, tokens = parse_predict(spec)
    rows, at = [], {}
    for series, law in joint.items():
        name, n = preset_n(series.split(" ", 1)[0], size, params)
        at[series] = (n, law, joint_boot[series])
        iv = interval(float(law(n, tokens)), [float(b(n, tokens)) for b in joint_boot[series]], level)
        rows.append({"series": series, "preset": name, "N": n, "D": tokens, "loss": iv.value, "loss_low": iv.low,
                     "loss_high": iv.high})  # fmt: skip
    if base not in at:
        return rows
    n_b, law_b, boot_b = at[base]
    for row in rows:
        if row["series"] == base:
            continue
        n, law, boot = at[row["series"]]

        def gap(x: Callable, y: Callable, n: int = n) -> float:
            return float(x(n, tokens)) - float(y(n_b, tokens))

        iv = interval(gap(law, law_b), [gap(a, b) for a, b in zip(boot, boot_b)], level)
        row.update({"gap": iv.value, "gap_low": iv.low, "gap_high": iv.high, "baseline": base})
    return rows


def _by_seed(runs: list[RunRecord], series_of: dict[str, str], loss: str) -> dict[str, dict]:
    out: dict[str, dict] = defaultdict(dict)
    for r in runs:
        out[series_of[r.run_dir]][r.seed] = getattr(r, loss)
    return out


def _paired_gap(a: dict, b: dict) -> Optional[float]:
    """Mean over the seeds both series have of (a - b); None when they share none."""
    both = sorted(set(a) & set(b))
    return fmean(a[s] - b[s] for s in both) if both else None


def naive(rows: list[dict], fitted: list[RunRecord], series_of: dict[str, str], n_of: Callable, loss: str) -> None:
    """The forecast to beat: each series' gap to the baseline stays what it measured at the largest fitted size (the
    baseline's largest N), at that size's largest budget of each series, paired by seed; added to `rows` as
    naive_gap and naive_at (that size)."""
    base = next((w["baseline"] for w in rows if "baseline" in w), None)
    mine = [r for r in fitted if series_of.get(r.run_dir) == base]
    if not mine:
        return
    top = max(mine, key=n_of)
    largest = size_of(top.model, top.arch)
    at = [r for r in fitted if r.run_dir in series_of and size_of(r.model, r.arch) == largest]
    budget: dict[str, int] = {}
    for r in at:
        budget[series_of[r.run_dir]] = max(budget.get(series_of[r.run_dir], 0), r.tokens)
    seeds = _by_seed([r for r in at if r.tokens == budget[series_of[r.run_dir]]], series_of, loss)
    for w in rows:
        if "gap" in w and w["series"] in seeds and base in seeds:
            w["naive_gap"], w["naive_at"] = _paired_gap(seeds[w["series"]], seeds[base]), largest


def scored(rows: list[dict], held: list[RunRecord], series_of: dict[str, str], loss: str) -> None:
    """Once the predicted size has trained (`holdout=<size>` beside `predict=`): each row gets its series' measured
    mean over seeds at (preset, D), whether the loss interval covers it, and the measured gap to the baseline (paired
    by seed) with whether the gap interval covers it."""
    size_tokens = {(w["preset"], w["D"]) for w in rows}
    seeds = _by_seed([r for r in held if (r.model, r.tokens) in size_tokens], series_of, loss)
    for w in rows:
        mine = seeds.get(w["series"])
        if not mine:
            continue
        w["measured"], w["seeds"] = fmean(mine.values()), len(mine)
        w["covered"] = bool(w["loss_low"] <= w["measured"] <= w["loss_high"])
        if "gap" in w and w["baseline"] in seeds:
            got = _paired_gap(mine, seeds[w["baseline"]])
            if got is not None:
                w["measured_gap"], w["gap_covered"] = got, bool(w["gap_low"] <= got <= w["gap_high"])


def markdown(spec: str, rows: list[dict], level: float) -> list[str]:
    if not rows:
        return []
    lines = [
        f"Prediction (predict={spec}), from L(N, D) before any run of this size; {level:.0%} bootstrap intervals "
        "(of the fit: they do not hold the error of extrapolating the law's form); the naive forecast of a gap is its "
        "measured value at the largest fitted size (largest budget, paired by seed):",
        "",
        "| series | preset | N | D | predicted loss [interval] | gap to baseline [interval] | naive gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in rows:
        gap = f"{w['gap']:+.4f} [{w['gap_low']:+.4f}, {w['gap_high']:+.4f}]" if "gap" in w else "(baseline)"
        naive_gap = f"{w['naive_gap']:+.4f} ({w['naive_at']})" if w.get("naive_gap") is not None else "-"
        lines.append(
            f"| {w['series']} | {w['preset']} | {w['N']:,} | {w['D']:,} | "
            f"{w['loss']:.4f} [{w['loss_low']:.4f}, {w['loss_high']:.4f}] | {gap} | {naive_gap} |"
        )
    measured = [w for w in rows if "measured" in w]
    if not measured:
        return lines
    lines += [
        "",
        "Measured (the predicted size, trained after the prediction): mean over seeds; a gap is paired by seed; "
        "closer: the prediction or the naive forecast, whichever is nearer the measured gap:",
        "",
        "| series | seeds | measured loss | loss error | covered | measured gap | gap error | covered | closer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in measured:
        cells = [w["series"], str(w["seeds"]), f"{w['measured']:.4f}", f"{w['loss'] - w['measured']:+.4f}"]
        cells.append("yes" if w["covered"] else "no")
        if "measured_gap" in w:
            g = w["measured_gap"]
            closer = "-"
            if w.get("naive_gap") is not None:
                closer = "prediction" if abs(w["gap"] - g) <= abs(w["naive_gap"] - g) else "naive"
            cells += [f"{g:+.4f}", f"{w['gap'] - g:+.4f}", "yes" if w["gap_covered"] else "no", closer]
        else:
            cells += ["(baseline)" if "gap" not in w else "-", "-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
