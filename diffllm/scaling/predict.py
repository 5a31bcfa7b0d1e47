"""`scaling fit predict=<size>@<tokens>`: a prediction made before the runs that test it (issue 32 §4). Each series'
L(N, D) fit gives the final loss of its arch's preset of that size (`<arch>-<size>`, its own N) trained on that many
tokens, with the bootstrap interval of its replicates, and each series' gap to the baseline series with the interval
of paired replicates: both series refitted on one draw of seeds (fit.py paired_joint; where no size has two seeds,
the two series' residual replicates paired by index). A gap from a fit that is not identified (fit.py
not_identified) is refused in one line. Beside it, three naive forecasts: no gap, the gap measured at the largest
fitted size, and a tokens-only law per series. Commit the report; once the size has trained, `scaling fit
holdout=<size>` on the sweep that holds it refits the same runs (same seeds, same replicates) and scores the same
predictions against the measured runs, with a skill score against each naive forecast (paired.py)."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional

import numpy as np

from ..errors import UserError
from ..model.accounting import model_stats
from ..model.presets import load_preset, preset_names
from ..results import RunRecord, kaplan_n
from .config import parse_predict
from .fit import fit_power_law, interval
from .paired import paired_gap, skill
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


def predictions(
    spec: str,
    params: str,
    joint: dict,
    joint_boot: dict,
    base: Optional[str],
    level: float,
    pairs: dict,
    why: dict,
    refuse: bool = True,
    order: tuple = (),
) -> list[dict]:
    """One row per series of `order` (default: those with an L(N, D) fit): its preset, N, D and, from its L(N, D) if it
    has one, the predicted loss [interval]; every row but the baseline's names the baseline and, where
    both have an L(N, D), gets the gap to the baseline's prediction [interval] (pairs: series -> (baseline replicates,
    its replicates) from one draw of seeds, or None: the residual replicates paired by index). why: series -> the
    reasons its fit is not identified; a row whose fit or the baseline's has some is refused its gap (`refused`), or,
    with refuse=False, keeps it flagged (`unidentified`). A series without a fit still gets the gap law and the naive
    forecasts (gap_law.add, naive): on a ladder of one budget no L(N, D) can be fitted, the gap law can."""
    size, tokens = parse_predict(spec)
    rows, at = [], {}
    for series in order or joint:
        name, n = preset_n(series.split(" ", 1)[0], size, params)
        row = {"series": series, "preset": name, "N": n, "D": tokens}
        if series in joint:
            law = at[series] = joint[series]
            iv = interval(float(law(n, tokens)), [float(b(n, tokens)) for b in joint_boot[series]], level)
            row.update({"loss": iv.value, "loss_low": iv.low, "loss_high": iv.high})
        rows.append(row)
    if base not in {w["series"] for w in rows}:
        return rows
    n_b = next(w["N"] for w in rows if w["series"] == base)
    for row in rows:
        if row["series"] == base:
            continue
        row["baseline"] = base
        if row["series"] not in at or base not in at:
            continue
        n, law, law_b = row["N"], at[row["series"]], at[base]
        boot_b, boot = pairs.get(row["series"]) or (joint_boot[base], joint_boot[row["series"]])

        def gap(x: Callable, y: Callable, n: int = n) -> float:
            return float(x(n, tokens)) - float(y(n_b, tokens))

        iv = interval(gap(law, law_b), [gap(a, b) for a, b in zip(boot, boot_b)], level)
        row["paired"] = pairs.get(row["series"]) is not None
        reasons = [f"{s}: {w}" for s in (base, row["series"]) for w in why.get(s, [])]
        if reasons and refuse:
            row["refused"] = "; ".join(reasons)
            continue
        row.update({"gap": iv.value, "gap_low": iv.low, "gap_high": iv.high})
        if reasons:
            row["unidentified"] = "; ".join(reasons)
    return rows


def _by_seed(runs: list[RunRecord], series_of: dict[str, str], loss: str) -> dict[str, dict]:
    out: dict[str, dict] = defaultdict(dict)
    for r in runs:
        out[series_of[r.run_dir]][r.seed] = getattr(r, loss)
    return out


def naive(rows: list[dict], fitted: list[RunRecord], series_of: dict[str, str], n_of: Callable, loss: str) -> None:
    """The forecasts to beat, added to `rows`: (1) no gap; (2) naive_gap: each series' gap to the baseline stays what
    it measured at the largest fitted size (the baseline's largest N), at that size's largest budget of each series,
    paired by seed (naive_at: that size); (3) tokens_loss: a tokens-only law L(D) = E + B D^-beta fitted to every
    fitted run of the series (size ignored), at the predicted D (on a ladder of one budget, predicted at it: the
    series' mean loss there), and tokens_gap, its difference to the baseline's."""
    for w in rows:
        mine = [r for r in fitted if series_of.get(r.run_dir) == w["series"] and r.tokens]
        if len(mine) >= 3 and len({r.tokens for r in mine}) >= 2:
            w["tokens_loss"] = float(fit_power_law([r.tokens for r in mine], [getattr(r, loss) for r in mine])(w["D"]))
        elif mine and {r.tokens for r in mine} == {w["D"]}:  # a ladder of one budget, predicted at it: its mean loss
            w["tokens_loss"] = float(np.mean([getattr(r, loss) for r in mine]))
    by = {w["series"]: w for w in rows}
    base = next((w["baseline"] for w in rows if "baseline" in w), None)
    for w in rows:
        if "baseline" in w and "tokens_loss" in w and "tokens_loss" in by[base]:
            w["tokens_gap"] = w["tokens_loss"] - by[base]["tokens_loss"]
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
        if "baseline" in w and w["series"] in seeds and base in seeds:
            both = sorted(set(seeds[w["series"]]) & set(seeds[base]))
            if both:
                w["naive_gap"] = float(np.mean([seeds[w["series"]][s] - seeds[base][s] for s in both]))
                w["naive_at"] = largest


def scored(rows: list[dict], held: list[RunRecord], series_of: dict[str, str], loss: str, level: float) -> None:
    """Once the predicted size has trained (`holdout=<size>` beside `predict=`): each row gets its series' measured
    mean over seeds at (preset, D), whether the loss interval covers it and the loss's skill against the tokens-only
    law; the measured gap to the baseline, paired by seed (its Student t interval, and Welch's unpaired one beside
    it), whether the gap interval covers it and the gap's skill against each naive forecast (paired.py skill)."""
    size_tokens = {(w["preset"], w["D"]) for w in rows}
    seeds = _by_seed([r for r in held if (r.model, r.tokens) in size_tokens], series_of, loss)
    for w in rows:
        mine = seeds.get(w["series"])
        if not mine:
            continue
        w["measured"], w["seeds"] = float(np.mean(list(mine.values()))), len(mine)
        if "loss" in w:
            w["covered"] = bool(w["loss_low"] <= w["measured"] <= w["loss_high"])
        if "tokens_loss" in w and "loss" in w:
            w["loss_skill"] = skill(w["loss"] - w["measured"], w["tokens_loss"] - w["measured"])
        got = paired_gap(mine, seeds[w["baseline"]], level) if "baseline" in w and w["baseline"] in seeds else None
        if got is None:
            continue
        g = got["paired"].value
        w["measured_gap"] = got
        if "law" in w:
            law = w["law"]
            law["covered"], law["skill"] = bool(law["low"] <= g <= law["high"]), _gap_skills(w, law["gap"], g)
        if "gap" in w:
            w["gap_covered"], w["gap_skill"] = bool(w["gap_low"] <= g <= w["gap_high"]), _gap_skills(w, w["gap"], g)


def _gap_skills(w: dict, forecast: float, measured: float) -> dict:
    """A forecast gap's skill against each naive forecast of row `w` that it has: no gap, the largest fitted size's,
    the tokens-only laws'."""
    naive_forecasts = {"zero": 0.0, "largest": w.get("naive_gap"), "tokens": w.get("tokens_gap")}
    return {k: skill(forecast - measured, v - measured) for k, v in naive_forecasts.items() if v is not None}


def _loss(w: dict) -> str:
    return f"{w['loss']:.4f} [{w['loss_low']:.4f}, {w['loss_high']:.4f}]" if "loss" in w else "- (no L(N, D) fit)"


def _f(x: Optional[float], fmt: str = "+.4f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(spec: str, rows: list[dict], level: float) -> list[str]:
    if not rows:
        return []
    lines = [
        f"Prediction (predict={spec}), from L(N, D) before any run of this size; {level:.0%} bootstrap intervals "
        "(of the fit: they do not hold the error of extrapolating the law's form; a gap's from replicates that redraw "
        "seeds once for both series, `paired`); the naive forecasts: no gap, the gap measured at the largest fitted "
        "size (largest budget, paired by seed), and a tokens-only law L(D) per series (size ignored):",
        "",
        "| series | preset | N | D | predicted loss [interval] | gap to baseline [interval] | naive gap | "
        "tokens-only loss | tokens-only gap |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in rows:
        if "refused" in w:
            gap = "refused: not identified"
        elif "baseline" in w and "gap" not in w:
            gap = "- (no L(N, D) fit)"
        elif "gap" in w:
            gap = f"{w['gap']:+.4f} [{w['gap_low']:+.4f}, {w['gap_high']:+.4f}]" + ("" if w["paired"] else " unpaired")
            gap += " (not identified)" if "unidentified" in w else ""
        else:
            gap = "(baseline)"
        naive_gap = f"{w['naive_gap']:+.4f} ({w['naive_at']})" if w.get("naive_gap") is not None else "-"
        lines.append(
            f"| {w['series']} | {w['preset']} | {w['N']:,} | {w['D']:,} | "
            f"{_loss(w)} | {gap} | {naive_gap} | "
            f"{_f(w.get('tokens_loss'), '.4f')} | {_f(w.get('tokens_gap'))} |"
        )
    for w in rows:
        for key, verb in (("refused", "refused: no gap is reported"), ("unidentified", "reported all the same")):
            if key in w:
                lines += ["", f"{w['series']}: gap {verb}; not identified ({w[key]})"]
    measured = [w for w in rows if "measured" in w]
    return lines + _law_markdown(rows, level) + (_scored_markdown(measured, level) if measured else [])


def _law_markdown(rows: list[dict], level: float) -> list[str]:
    """The gap laws (gap_law.py): each gap fitted seed by seed, its prediction, and once measured, its score."""
    laws = [w for w in rows if "law" in w]
    if not laws:
        return []
    lines = [
        "",
        "Gap law (diffllm/scaling/gap_law.py): g = a + b·log2 N + c·log2 D (a + b·log2 N on a ladder of one budget) "
        "fitted to each seed's gaps over the "
        f"cells both series trained (same size and budget rank, same seed), at the baseline's N and D; {level:.0%} "
        "Student t interval over the seeds' predictions (the law's form assumed, not tested):",
        "",
        "| series | cells | seeds | a, b(, c) (seed mean) | predicted gap [interval] | measured gap | error | covered "
        "| skill vs zero / largest / tokens-only |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in laws:
        law, got = w["law"], w.get("measured_gap")
        cells = [w["series"], str(law["cells"]), str(law["seeds"]), ", ".join(f"{c:+.4f}" for c in law["coef"])]
        cells.append(f"{law['gap']:+.4f} [{law['low']:+.4f}, {law['high']:+.4f}]")
        if got is None:
            cells += ["-"] * 4
        else:
            g, sk = got["paired"].value, law["skill"]
            cells += [f"{g:+.4f}", f"{law['gap'] - g:+.4f}", "yes" if law["covered"] else "no"]
            cells.append(" / ".join(_f(sk.get(k), "+.2f") for k in ("zero", "largest", "tokens")))
        lines.append("| " + " | ".join(cells) + " |")
    for w in laws:
        if w["law"]["left_out"]:
            lines += ["", f"{w['series']}: gap law without seed(s) {w['law']['left_out']} (missing a cell)"]
    return lines


def _scored_markdown(measured: list[dict], level: float) -> list[str]:
    lines = [
        "",
        "Measured (the predicted size, trained after the prediction): mean over seeds; error = forecast - measured; a "
        f"gap is paired by seed ({level:.0%} Student t interval over the per-seed differences; unpaired: Welch's, "
        "as if the seeds were independent); skill = 1 - |error of the fit| / |error of the naive forecast| (> 0: the "
        "fit is nearer), against the tokens-only law for a loss and against no gap / the largest fitted size's gap / "
        "the tokens-only gap for a gap:",
        "",
        "| series | seeds | measured loss | loss error | covered | skill vs tokens-only | measured gap [paired] | "
        "unpaired | ahead | gap error | covered | skill vs zero / largest / tokens-only |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in measured:
        cells = [w["series"], str(w["seeds"]), f"{w['measured']:.4f}"]
        if "loss" in w:
            cells += [f"{w['loss'] - w['measured']:+.4f}", "yes" if w["covered"] else "no"]
        else:
            cells += ["- (no fit)", "-"]
        cells.append(_f(w.get("loss_skill"), "+.2f"))
        got = w.get("measured_gap")
        if got is None:
            cells += ["(baseline)" if "baseline" not in w else "-"] + ["-"] * 5
        else:
            p, u = got["paired"], got["unpaired"]
            cells += [f"{p.value:+.4f} [{p.low:+.4f}, {p.high:+.4f}]", f"[{u.low:+.4f}, {u.high:+.4f}]"]
            cells.append(f"{got['ahead']}/{got['seeds']}")
            if "gap" in w:
                sk = w["gap_skill"]
                cells += [f"{w['gap'] - p.value:+.4f}", "yes" if w["gap_covered"] else "no"]
                cells.append(" / ".join(_f(sk.get(k), "+.2f") for k in ("zero", "largest", "tokens")))
            else:
                cells += ["(refused)" if "refused" in w else "(no L(N, D) fit)", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
