"""`diffllm scaling fit sweep_dir=<dir or its runs.csv> [out=<dir>]`: per arch L(N) = E + A N^-alpha (final loss vs
size) and L(N, D) (final points when the grid has several budgets, otherwise the validation learning curves), bootstrap
intervals for every parameter (L(N): runs redrawn per size, each series from its own generator, ratios paired by
seed; L(N, D): residual; E at its bound 0 said in a note), each variant's parameter and token ratios over the
baseline (the Transformer) at equal loss, the compute-optimal frontier of each L(N, D) with C counted from each run's
own FLOPs per token and the compute ratio at equal loss (diffllm/scaling/optimal.py), PNG plots, fits.md and
fits.json. Ratio keys carry an `<series>:` prefix when the sweep holds more than one series besides the
baseline.

Fits are per *series* (the arch plus the non-selected axes that vary, diffllm/scaling/select.py), over the runs at
each group's selected value of `select` (every reported seed a point). Every selected run is fitted, under-trained
ones (not beating the bigram baseline, diffllm/scaling/baselines.py) included: leaving them out selects on the
outcome. exclude_undertrained=true leaves them out, and fits.md then also gives L(N) with them kept, so that the
effect of the exclusion is in the report. fits.md also gives the selection, its
edge warnings, the paired per-seed gaps to the Transformer and the baselines beside the runs."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import UserError
from ..model.registry import baseline, variants
from ..results import RunRecord, relative
from . import gap_law, holdout, predict
from .baselines import BASELINES_NOTE
from .config import ScalingConfig
from .fit import (
    JOINT_KEYS,
    JOINT_PARAMS,
    POWER_LAW_PARAMS,
    Interval,
    PowerLaw,
    at_bounds,
    bootstrap_joint,
    bootstrap_power_law,
    check_identified,
    exactly_determined,
    interval,
    no_interval,
    paired_power_laws,
    ratio_at_equal_loss,
    ratio_interval,
)
from .inputs import read_all, val_curve
from .optimal import SeriesRuns, compute_optimal, optimal_markdown, run_flops_per_token
from .paired import paired_fits
from .plots import FigureData, figures, save
from .resample import generator
from .select import (
    Selection,
    baseline_series,
    choices_markdown,
    gap_dict,
    gaps_markdown,
    paired_gaps,
    run_rows,
    runs_markdown,
    select_runs,
    selection_dict,
    under_trained_note,
)

N_LABEL = {
    "block": "parameters N (non-embedding, no output head)",
    "nonembedding": "non-embedding parameters",
    "total": "total parameters",
}


def _n(r: RunRecord, params: str) -> Optional[int]:
    return {"block": r.block_params, "nonembedding": r.nonembedding_params, "total": r.total_params}[params]


@dataclass
class ArchFit:
    arch: str
    points: int
    law: PowerLaw
    E: Interval
    A: Interval
    alpha: Interval

    @property
    def flags(self) -> tuple[str, ...]:
        return at_bounds(self.law)


def _by_series(runs: list[RunRecord], sel: Selection) -> dict[str, list[RunRecord]]:
    """Runs grouped by series, in registered-variant order (baseline first), then by label."""
    order = {a: i for i, a in enumerate(variants())}
    groups: dict[str, list[RunRecord]] = {}
    for r in sorted(runs, key=lambda r: (order.get(r.arch, len(order)), sel.series[r.run_dir])):
        groups.setdefault(sel.series[r.run_dir], []).append(r)
    return groups


def _exact_note(what: str, n_points: int, n_params: int) -> str:
    return (
        f"{what}: {n_points} points for {n_params} parameters: the fit is exactly determined (it passes through "
        f"every point); no intervals are given for it or for ratios from it: add sizes, budgets or seeds"
    )


def _interval(value: float, samples, level: float, exact: bool) -> Interval:
    return no_interval(value) if exact else interval(value, samples, level)


def _power_fits(cfg: ScalingConfig, runs: list[RunRecord], sel: Selection, notes: list[str], seeds: dict = None):
    """Per series: its points, L(N), bootstrap replicates (over runs, from the series' own generator) and table row;
    `seeds` (if given) gets each series' run seeds, for the paired ratio replicates."""
    points, fits, boots, table = {}, {}, {}, []
    for arch, rs in _by_series(runs, sel).items():
        n = np.array([_n(r, cfg.params) for r in rs], dtype=float)
        y = np.array([getattr(r, cfg.loss) for r in rs], dtype=float)
        points[arch] = (n, y)  # plotted even when too few to fit
        if seeds is not None:
            seeds[arch] = [r.seed for r in rs]
        try:
            check_identified("L(N)", len(y), len(set(n)))
            best, boot = bootstrap_power_law(n, y, cfg.reps, generator(cfg.seed, arch), [r.seed for r in rs])
        except ValueError as e:  # too few points or sizes left (selection, under-trained runs left out)
            notes.append(f"L(N) for {arch}: no fit ({e})")
            continue
        fits[arch], boots[arch] = best, boot
        notes += _at_bound_note(f"L(N) for {arch}", best, boot)
        if exactly_determined(len(rs), POWER_LAW_PARAMS):
            notes.append(_exact_note(f"L(N) for {arch}", len(rs), POWER_LAW_PARAMS))
            table.append(ArchFit(arch, len(rs), best, *(no_interval(getattr(best, k)) for k in ("E", "A", "alpha"))))
            continue
        table.append(
            ArchFit(
                arch,
                len(rs),
                best,
                *(interval(getattr(best, k), [getattr(b, k) for b in boot], cfg.level) for k in ("E", "A", "alpha")),
            )
        )
    return points, fits, boots, table


def _at_bound_note(what: str, law, boot: list) -> list[str]:
    """E = 0 is the non-negativity bound, not a measured irreducible loss: say so (with how many replicates agree)."""
    if law.E > 0:
        return []
    pinned = sum(b.E <= 0 for b in boot)
    return [
        f"{what}: E = 0 is the bound of the fit (E >= 0), not an estimate: the points ask for E <= 0 ({pinned}/"
        f"{len(boot)} bootstrap replicates too), so the irreducible loss is undetermined and extrapolations rest "
        "on the power-law terms alone: add sizes or budgets"
    ]


def _compute_runs(cfg: ScalingConfig, series: dict[str, list[RunRecord]], notes: list[str]) -> dict[str, SeriesRuns]:
    """Each series' final points in compute terms (C = the run's own FLOPs per token x its tokens)."""
    out = {}
    for arch, rs in series.items():
        f = [run_flops_per_token(r) for r in rs]
        kept = [(r, x) for r, x in zip(rs, f) if x and r.tokens]
        if len(kept) < len(rs):
            notes.append(
                f"compute-optimal {arch}: {len(rs) - len(kept)} run(s) without FLOPs per token (no readable "
                "model config, no summary flops) left out of the compute plots and f(N)"
            )
        if kept:
            out[arch] = SeriesRuns(
                *(
                    np.array(v, dtype=float)
                    for v in zip(*[(_n(r, cfg.params), r.tokens, x, getattr(r, cfg.loss)) for r, x in kept])
                ),
                under=np.array([bool(r.under_trained) for r, _ in kept]),
            )
    return out


def _joint_points(cfg: ScalingConfig, rs: list[RunRecord], mode: str):
    """(N, D, loss, seed) of each point of a series' L(N, D): its runs' final points, or their learning curves."""
    if mode == "final":
        return tuple(zip(*[(_n(r, cfg.params), r.tokens, getattr(r, cfg.loss), r.seed) for r in rs]))
    n, d, y, seeds = [], [], [], []
    for r in rs:
        tokens, loss = val_curve(r.run_dir)
        keep = tokens >= cfg.curve_min_fraction * (r.tokens or tokens.max())
        n += [_n(r, cfg.params)] * int(keep.sum())
        d += list(tokens[keep])
        y += list(loss[keep])
        seeds += [r.seed] * int(keep.sum())
    return n, d, y, seeds


def fit_sweep(cfg: ScalingConfig, runs: list[RunRecord], notes: Optional[list[str]] = None) -> dict:
    cfg.validate()
    finished = [r for r in runs if r.status == "finished" and getattr(r, cfg.loss) is not None and _n(r, cfg.params)]
    if not finished:
        raise UserError(f"sweep_dir={cfg.sweep_dir}: no finished runs with {cfg.loss} and {cfg.params} params")
    predict.check(cfg.predict, {r.arch for r in finished}, cfg.params)  # a missing preset fails before fitting
    sel = select_runs(finished, cfg.select, cfg.loss, cfg.select_protocol, cfg.select_seeds, cfg.report_seeds)
    notes = list(notes or []) + sel.notes
    reported, held = holdout.split([r for r in finished if r.run_dir in sel.selected], cfg.holdout)
    done = [r for r in reported if not (cfg.exclude_undertrained and r.under_trained)]
    note = under_trained_note(finished, sel, cfg.exclude_undertrained)
    if note:
        notes.append(note)
    if not done:
        raise UserError(f"sweep_dir={cfg.sweep_dir}: no run left to fit ({note})")
    budget = cfg.tokens or max(
        {r.tokens for r in done}, key=lambda t: (len({_n(r, cfg.params) for r in done if r.tokens == t}), t)
    )
    at_budget = [r for r in done if r.tokens == budget]
    if not at_budget:
        raise UserError(f"tokens={budget}: no finished run has this budget")
    run_seeds: dict = {}
    points, fits, boots, table = _power_fits(cfg, at_budget, sel, notes, run_seeds)
    kept_table = None  # exclude_undertrained: L(N) with the excluded runs kept, for the report's both-ways view
    if len(done) < len(reported):
        kept_table = _power_fits(cfg, [r for r in reported if r.tokens == budget], sel, [])[3]
    gaps, gap_notes = paired_gaps(finished, sel, baseline().arch, cfg.loss)
    result: dict = {
        "config": asdict(cfg),
        "runs": len(finished),
        "fit_inputs": len(done),
        "power_law_tokens": budget,
        "power_law": table,
        "power_law_with_undertrained": kept_table,
        "ratios": {},
        "notes": notes + gap_notes,
        "selection": selection_dict(sel),
        "gaps": [gap_dict(g, cfg.level) for g in gaps],
    }
    notes = result["notes"]
    base = baseline_series(sel, fits, baseline().arch)
    others = [a for a in fits if a != base] if base in fits else []
    key = {a: ("" if len(others) == 1 else f"{a}:") for a in others}
    exact = {f.arch for f in table if f.alpha.exact}  # archs whose L(N) is exactly determined
    pair_boot = {}  # the ratio's replicates: both series from one draw, paired by seed (else their own replicates)
    for a in others:
        data = [(*points[s], run_seeds[s]) for s in (base, a)]
        pairs = (
            paired_power_laws(*data, cfg.reps, generator(cfg.seed, f"{base}|{a}")) if not {base, a} & exact else None
        )
        pair_boot[a] = pairs or (boots[base], boots[a])
    for a in others:  # the variant's parameters needed for the baseline's loss, at each baseline size of the sweep
        for n_ref in sorted(set(points[base][0])):
            result["ratios"][f"{key[a]}params_at_N={int(n_ref)},D={budget}"] = (
                no_interval(ratio_at_equal_loss(fits[base], fits[a], n_ref))
                if {base, a} & exact
                else ratio_interval(fits[base], pair_boot[a][0], fits[a], pair_boot[a][1], n_ref, cfg.level)
            )
    mode = cfg.joint
    budgets = {r.tokens for r in done}
    if mode == "auto":
        mode = "final" if len(budgets) > 1 else "curves"
    joint, joint_boot, joint_exact, joint_points = {}, {}, set(), {}
    series = _by_series(done, sel)
    if mode != "none":
        for arch, rs in series.items():
            n, d, y, seeds = joint_points[arch] = _joint_points(cfg, rs, mode)
            try:
                check_identified("L(N, D)", len(y), len(set(n)))
                joint[arch], joint_boot[arch] = bootstrap_joint(
                    n, d, y, max(cfg.reps // 4, 20), generator(cfg.seed, arch)
                )
            except ValueError as e:
                notes.append(f"L(N, D) for {arch} from {mode}: skipped ({e})")
                continue
            if exactly_determined(len(y), JOINT_PARAMS):
                notes.append(_exact_note(f"L(N, D) for {arch}", len(y), JOINT_PARAMS))
                joint_exact.add(arch)
            notes += _at_bound_note(f"L(N, D) for {arch}", joint[arch], joint_boot[arch])
    result["joint_mode"] = mode
    result["joint"] = {
        a: {
            "law": asdict(j),
            "flags": at_bounds(j),
            **{
                k: _interval(getattr(j, k), [getattr(b, k) for b in joint_boot[a]], cfg.level, a in joint_exact)
                for k in JOINT_KEYS
            },
        }
        for a, j in joint.items()
    }
    for a in (o for o in others if base in joint and o in joint):
        ref = max(series[base], key=lambda r: (r.tokens, _n(r, cfg.params)))
        n_ref, d_ref = _n(ref, cfg.params), ref.tokens  # inside the data: the largest size at the largest budget
        t, dd = joint[base], joint[a]
        samples = [
            ratio_at_equal_loss(bt.at_params(n_ref), bd.at_params(n_ref), d_ref)
            for bt, bd in zip(joint_boot[base], joint_boot[a])
        ]
        pair_exact = bool({base, a} & joint_exact)
        result["ratios"][f"{key[a]}tokens_at_N={int(n_ref)},D={d_ref}"] = _interval(
            ratio_at_equal_loss(t.at_params(n_ref), dd.at_params(n_ref), d_ref), samples, cfg.level, pair_exact
        )
        samples = [
            ratio_at_equal_loss(bt.at_tokens(d_ref), bd.at_tokens(d_ref), n_ref)
            for bt, bd in zip(joint_boot[base], joint_boot[a])
        ]
        result["ratios"][f"{key[a]}params_from_joint_at_N={int(n_ref)},D={d_ref}"] = _interval(
            ratio_at_equal_loss(t.at_tokens(d_ref), dd.at_tokens(d_ref), n_ref), samples, cfg.level, pair_exact
        )
    result["ratio_archs"] = [base] + others
    base_joint = baseline_series(sel, joint, baseline().arch)
    pairs, why, more = paired_fits(joint_points, joint, result["joint"], joint_exact, base_joint, cfg.reps, cfg.seed)
    notes += more
    # a run is "fitted" when a fit that was made used it: L(N) of its series at the L(N) budget, or its series' L(N, D)
    in_fit = {r.run_dir for r in at_budget if sel.series[r.run_dir] in fits}
    in_fit |= {r.run_dir for r in done if sel.series[r.run_dir] in joint}
    result["fit_runs"] = len(in_fit)
    result["runs_table"] = run_rows(finished, sel, in_fit, cfg.loss)
    result["compute_optimal"], optimal_plot = None, None
    compute_runs = _compute_runs(cfg, {a: rs for a, rs in series.items() if a in joint}, notes)
    if compute_runs:
        result["compute_optimal"], more, optimal_plot = compute_optimal(
            compute_runs,
            joint,
            joint_boot,
            joint_exact,
            baseline_series(sel, joint, baseline().arch),
            cfg.level,
            cfg.compute_grid,
            cfg.compute_ref,
            pairs,
        )
        notes += more
        for a, row in result["compute_optimal"]["series"].items():
            if "multiplier" in row and (why[a] or why[base_joint]) and cfg.refuse_unidentified:
                row["multiplier_refused"] = "; ".join(f"{s}: {w}" for s in (base_joint, a) for w in why[s])
                notes.append(f"compute multiplier of {a}: refused, not identified ({row['multiplier_refused']})")
    if cfg.predict:
        base_all = baseline_series(sel, series, baseline().arch)  # the gap law's baseline, with or without L(N, D)
        rows = predict.predictions(cfg.predict, cfg.params, joint, joint_boot, base_all, cfg.level, pairs, why,
                                   cfg.refuse_unidentified, order=tuple(series))  # fmt: skip
        predict.naive(rows, done, sel.series, lambda r: _n(r, cfg.params), cfg.loss)
        gap_law.add(rows, done, sel.series, lambda r: _n(r, cfg.params), cfg.loss, cfg.level)
        if not joint and not any("law" in w for w in rows):
            why_not = _why_no_fit(notes, "L(N, D)")
            one = f"; a ladder of one budget predicts its gap at {min(budgets)} tokens only" * (len(budgets) == 1)
            raise UserError(f"predict={cfg.predict}: no L(N, D) fit to predict from ({why_not}){one}")
        predict.scored(rows, held, sel.series, cfg.loss, cfg.level)
        result["prediction"] = rows
    if held:
        result["holdout"] = holdout.predictions(
            held,
            sel.series,
            lambda r: _n(r, cfg.params),
            cfg.loss,
            budget,
            (fits, boots),
            (joint, joint_boot),
            cfg.level,
        )
        if all(w["predicted"] is None for w in result["holdout"]):
            why = _why_no_fit(notes, "L(N)", "L(N, D)")
            raise UserError(f"holdout={cfg.holdout}: no fit to predict the held-out runs from ({why})")
    result["_plot"] = FigureData(
        cfg.title,
        N_LABEL[cfg.params],
        cfg.loss,
        lambda r: _n(r, cfg.params),
        sel.series,
        at_budget,
        fits,
        done,
        joint,
        mode,
        optimal_plot,
        list(notes),
        len(reported) - len(done),
    )
    return result


def _why_no_fit(notes: list[str], *laws: str) -> str:
    """The first note saying why a fit of one of `laws` was not made, for a refusal."""
    starts = tuple(f"{law} for " for law in laws)
    return next((n for n in notes if n.startswith(starts) and (": no fit (" in n or ": skipped (" in n)), "no fit")


def write_report(cfg: ScalingConfig, result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [save(fig, out / name) for name, fig in figures(result.pop("_plot")).items()]
    table = [{**row, "run_dir": relative(row["run_dir"], out)} for row in result.get("runs_table", [])]  # as runs.csv
    (out / "fits.json").write_text(json.dumps({**result, "runs_table": table}, indent=1, default=_jsonable) + "\n")
    (out / "fits.md").write_text(render(result))
    return files + [out / "fits.json", out / "fits.md"]


def _jsonable(o):
    if isinstance(o, Interval):
        if o.exact:
            return {"value": o.value, "exact": True}
        return {"value": o.value, "low": o.low, "high": o.high, "n_valid": o.n_valid, "n_total": o.n_total}
    if isinstance(o, ArchFit):
        return {**asdict(o), "flags": list(o.flags)}
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))


def _law_table(rows: list[ArchFit]) -> list[str]:
    head = ["| series | points | E | A | alpha | at a bound |", "|---|---|---|---|---|---|"]
    return head + [f"| {f.arch} | {f.points} | {f.E} | {f.A} | {f.alpha} | {', '.join(f.flags) or '-'} |" for f in rows]


def render(result: dict) -> str:
    cfg = result["config"]
    lvl = f"{cfg['level']:.0%}"
    fitted = result.get("fit_runs", result["runs"])
    head = (
        f"Fits over {fitted} of {result['runs']} finished runs"
        if fitted
        else f"No fit was made from the {result.get('fit_inputs')} of {result['runs']} finished runs given to the fits "
        "(the notes say why)"
    )
    lines = [
        f"{head}; N = {cfg['params']} parameters, loss = {cfg['loss']}; [{lvl} bootstrap intervals: L(N) over runs "
        "(seeds redrawn per size; residual where every size has one run), L(N, D) residual].",
        "",
    ]
    chosen = result.get("selection", {})
    if chosen.get("select") and chosen.get("protocol"):
        lines += [f"Selection of {chosen['select']}: {chosen['protocol']['description']}.", ""]
    lines += [f"note: {note}" for note in result.get("notes", [])] + ([""] if result.get("notes") else [])
    if result["power_law"]:
        lines += [
            f"L(N) = E + A N^-alpha at D = {result['power_law_tokens']:,} tokens:",
            "",
        ] + _law_table(result["power_law"])
    else:
        lines.append("No L(N) fit was made (the notes above say why).")
    if result.get("power_law_with_undertrained") is not None:
        lines += [
            "",
            "The same L(N) with the under-trained runs kept (exclude_undertrained=false, the default):",
            "",
        ] + _law_table(result["power_law_with_undertrained"])
    if result["joint"]:
        lines += [
            "",
            f"L(N, D) = E + A N^-alpha + B D^-beta, points from {result['joint_mode']}:",
            "",
            "| series | " + " | ".join(JOINT_KEYS) + " | at a bound |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {arch} | " + " | ".join(str(j[k]) for k in JOINT_KEYS) + f" | {', '.join(j['flags']) or '-'} |"
            for arch, j in result["joint"].items()
        ]
    lines += optimal_markdown(result.get("compute_optimal"))
    if result.get("prediction"):
        lines += [""] + predict.markdown(cfg["predict"], result["prediction"], cfg["level"])
    if result.get("holdout"):
        lines += [""] + holdout.markdown(cfg["holdout"], result["holdout"], cfg["level"])
    if result["ratios"]:
        base, *others = result["ratio_archs"]
        names = " and ".join(variants()[a].label if a in variants() else a for a in others)
        ref = variants()[base].label if base in variants() else base
        lines += [
            "",
            f"{names} / {ref} at equal loss (paper, Diff at 3B-13B: 62.2% of the parameters, 63.7% of the tokens):",
            "",
            "| ratio | value [interval] |",
            "|---|---|",
        ]
        for name, iv in result["ratios"].items():
            lines.append(f"| {name} | {iv} |")
    select = cfg.get("select") if result.get("selection", {}).get("select") else None
    for part in (
        choices_markdown(result["selection"]) if "selection" in result else [],
        gaps_markdown(result.get("gaps", []), select),
        runs_markdown(result.get("runs_table", []), select),
    ):
        lines += [""] + part if part else []
    if any(row["bigram"] is not None for row in result.get("runs_table", [])):
        lines += ["", BASELINES_NOTE]
    return "\n".join(lines) + "\n"


def main() -> None:
    from ..config import hydra_app

    @hydra_app("scaling", {"": ScalingConfig}, prog="diffllm scaling fit")
    def app(node, typed: dict) -> None:
        cfg = typed[""]
        notes: list[str] = []
        runs, folder = read_all(cfg.sweep_dir, cfg.add_runs, notes)
        result = fit_sweep(cfg, runs, notes)
        files = write_report(cfg, result, Path(cfg.out or folder / "scaling"))
        for note in result["selection"]["warnings"] + result.get("notes", []):
            print(f"diffllm scaling fit: warning: {note}", file=sys.stderr)
        print(files[-1].read_text(), end="")
        print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)

    app()
