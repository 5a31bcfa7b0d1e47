"""Best-of-grid selection over a collected sweep, the series it leaves, and the paired gaps to the baseline arch.

A run's axes (RunRecord.axes: the dotted config keys that differ between the runs of one (model, tokens) group) are
split in two: the `select` axis (e.g. optim.lr), chosen per group, and the rest, which with the arch name a *series*
(e.g. `diff λ_init=0.8`: Diff with model.lambda_init=0.8, its own curve). For each (series, size, budget) the selected
value is the one with the best mean over its seeds of the `by` metric (the lowest final validation loss by default;
the highest held-out recall accuracy with by=recall_acc); a value at the edge (min or max) of those tried is warned
about: the optimum may lie outside the grid. Gaps pair each non-baseline series with the baseline arch's series (the
Transformer) at the same preset size and budget, seed by seed, each side at its own selected value.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..errors import UserError
from ..results import flatten
from .config import DEFAULT_SELECT, DEFAULT_SELECT_BY
from .paired import mean_interval
from .protocol import Protocol, nearest, quadratic_optimum, resolve

if TYPE_CHECKING:
    from ..results import RunRecord

SHORT = {"model.lambda_init": "λ_init"}  # short labels for series and markdown; others: the last dotted component
NULL = {"model.lambda_init": "formula"}  # what a null value means, per key (others: "null")
SELECT_BY = ("final_val_loss", "final_train_loss", "recall_acc")  # RunRecord fields best-of-grid can choose by
HIGHER_IS_BETTER = frozenset({"recall_acc"})  # ... the best is the highest mean; for the others, the lowest


def short_label(key: str) -> str:
    return SHORT.get(key, key.rsplit(".", 1)[-1])


def value_label(key: str, value: Any) -> str:
    if value is None:
        return NULL.get(key, "null")
    return f"{value:g}" if isinstance(value, float) else str(value)


@functools.cache
def size_of(model: str, arch: str) -> str:
    """The preset's size, so that transformer-micro-2 and diff-micro-2 pair: the `size/<size>` base in the defaults
    list of configs/model/<model>.yaml (presets compose arch/<arch> with size/<size>); else the name after the
    `<arch>-` prefix; else the name itself."""
    from ..config import group_defaults

    size = group_defaults("model", model).get("size")
    return size or (model[len(arch) + 1 :] if model.startswith(f"{arch}-") else model)


def _order(v: Any) -> tuple:
    return (v is None, v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0, str(v))


@dataclass(frozen=True)
class Choice:
    """The selected value of one (series, size, budget) group."""

    series: str
    size: str
    model: str
    tokens: Optional[int]
    value: Any  # the selected value (None without a select axis)
    values: tuple  # the values tried, in order
    means: tuple  # mean of the selection metric over seeds at each value tried (same order)
    seeds: int  # reported runs at the selected value
    optimum: Optional[float] = None  # select_protocol=quadratic: the fitted optimum the chosen value is nearest to

    @property
    def at_edge(self) -> bool:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)
        return numeric and len(self.values) >= 2 and self.value in (self.values[0], self.values[-1])


@dataclass
class Selection:
    select: Optional[str]  # the axis chosen over (None: nothing chosen; every run is selected)
    by: str = DEFAULT_SELECT_BY  # the metric chosen by (SELECT_BY)
    series: dict[str, str] = field(default_factory=dict)  # run_dir -> series label
    arch: dict[str, str] = field(default_factory=dict)  # series label -> arch
    selected: set = field(default_factory=set)  # run_dirs at the selected value of their group
    choices: list[Choice] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    protocol: Protocol = Protocol("same")  # how values were chosen and which seeds are reported
    notes: list[str] = field(default_factory=list)  # groups the protocol could not apply as asked


def series_label(r: RunRecord, axes: list[str]) -> str:
    """`arch` plus `short=value` for each of `axes` (the non-selected axes that vary within this arch's runs)."""
    return " ".join([r.arch] + [f"{short_label(k)}={value_label(k, r.axes.get(k))}" for k in axes])


def series_without(records: list[RunRecord], free: set) -> dict[str, str]:
    """run_dir -> series: the arch and those of its axes not in `free` whose values differ among the arch's runs
    (`sweep collect`'s series, with the `free` axes left out so that a study can compare across them)."""
    by_arch: dict[str, list[RunRecord]] = defaultdict(list)
    for r in records:
        by_arch[r.arch].append(r)
    out = {}
    for rs in by_arch.values():
        keys = sorted({k for r in rs for k in r.axes} - set(free))
        varying = [k for k in keys if len({repr(r.axes.get(k)) for r in rs}) > 1]
        out.update({r.run_dir: series_label(r, varying) for r in rs})
    return out


@functools.cache
def config_keys() -> frozenset:
    """Every dotted key of a train config (its typed groups at their defaults)."""
    from ..config import schema_node
    from ..train.app import SCHEMA

    return frozenset(flatten(schema_node(SCHEMA)))


def check_select(select: Optional[str], axes: set) -> None:
    """`select` must name an axis of the runs or a train-config key; a typo gets a one-line did-you-mean."""
    if select is None or select in axes:
        return
    keys = config_keys() | axes
    if select not in keys:
        near = difflib.get_close_matches(select, sorted(keys), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"select={select}: no run's config has this key{hint}")


def check_select_by(by: str) -> None:
    """`by` must be one of SELECT_BY; a typo gets a one-line did-you-mean."""
    if by not in SELECT_BY:
        near = difflib.get_close_matches(by, SELECT_BY, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"select_by={by}: expected one of {', '.join(SELECT_BY)}{hint}")


def mark_selected(
    records: list[RunRecord], select: Optional[str] = DEFAULT_SELECT, by: str = DEFAULT_SELECT_BY, **protocol
) -> None:
    """Each record's `selected` flag: reported at its group's selected value (None for runs no group holds:
    unfinished). `protocol`: select_runs' protocol keywords."""
    sel = select_runs(records, select, by, **protocol)
    for r in records:
        r.selected = (r.run_dir in sel.selected) if r.run_dir in sel.series else None


def select_runs(
    records: list[RunRecord],
    select: Optional[str] = DEFAULT_SELECT,
    by: str = DEFAULT_SELECT_BY,
    protocol: str = "same",
    select_seeds: Optional[Sequence] = None,
    report_seeds: Optional[Sequence] = None,
) -> Selection:
    """Series, reported runs, choices and edge warnings under a selection protocol (diffllm/scaling/protocol.py; the
    commands default to `auto`, this function to `same` for its library callers). Only finished runs with a value of
    `by` take part."""
    axis_names = sorted({k for r in records for k in r.axes})
    check_select(select, set(axis_names))
    check_select_by(by)
    select_axis = select if select in axis_names else None  # a constant key: nothing to choose
    done = [r for r in records if r.status == "finished" and getattr(r, by) is not None]
    by_arch: dict[str, list] = defaultdict(list)
    for r in done:
        by_arch[r.arch].append(r)
    sel = Selection(select_axis, by, protocol=resolve(protocol, [r.seed for r in done], select_seeds, report_seeds))
    for arch, rs in by_arch.items():  # series axes: non-selected axes whose value differs within this arch
        varying = [k for k in axis_names if k != select_axis and len({repr(r.axes.get(k)) for r in rs}) > 1]
        for r in rs:
            sel.series[r.run_dir] = series_label(r, varying)
            sel.arch[sel.series[r.run_dir]] = arch
    groups: dict[tuple, list] = defaultdict(list)
    for r in done:
        groups[(sel.series[r.run_dir], r.model, r.tokens)].append(r)
    for (series, model, tokens), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        _choose(sel, series, model, tokens, rs)
    return sel


def _choose(sel: Selection, series: str, model: str, tokens: Optional[int], rs: list[RunRecord]) -> None:
    """One (series, size, budget) group: the value chosen under the protocol, the runs reported at it."""
    axis, by, proto = sel.select, sel.by, sel.protocol
    sign = -1.0 if by in HIGHER_IS_BETTER else 1.0
    tried = {r.axes.get(axis) if axis else None for r in rs}
    where = f"{series}, {size_of(model, rs[0].arch)}, {'?' if tokens is None else f'{tokens:,}'} tokens"
    pick, report = rs, rs  # runs the value is chosen on; runs reported at it
    if len(tried) > 1 and proto.mode == "split":
        pick = [r for r in rs if r.seed in proto.select_seeds]
        report = [r for r in rs if r.seed in proto.report_seeds]
        if not pick:
            pick = rs
            sel.notes.append(f"{where}: no run of select seed(s) {proto.select_seeds}: chosen on every seed (same)")
    at: dict = defaultdict(list)
    for r in pick:
        at[r.axes.get(axis) if axis else None].append(r)
    values = tuple(sorted(at, key=_order))
    means = tuple(sum(getattr(r, by) for r in at[v]) / len(at[v]) for v in values)
    best, optimum = min(range(len(values)), key=lambda i: (sign * means[i], i)), None
    if len(values) > 1 and proto.mode == "quadratic":
        optimum = quadratic_optimum([r.axes.get(axis) for r in pick], [getattr(r, by) for r in pick], sign < 0)
        if optimum is None:
            sel.notes.append(
                f"{where}: no quadratic optimum in log {axis} (fewer than 3 values, or not convex): best of grid"
            )
        else:
            best = nearest(values, optimum)
    value = values[best]
    reported = [r for r in report if (r.axes.get(axis) if axis else None) == value]
    if not reported:
        sel.notes.append(
            f"{where}: no run of report seed(s) {proto.report_seeds} at the chosen {axis}="
            f"{value_label(axis, value)}: nothing reported"
        )
    choice = Choice(series, size_of(model, rs[0].arch), model, tokens, value, values, means, len(reported), optimum)
    sel.choices.append(choice)
    sel.selected.update(r.run_dir for r in reported)
    if choice.at_edge:
        listed = ", ".join(value_label(axis, v) for v in values)
        sel.warnings.append(
            f"{where}: the best {axis}={value_label(axis, value)} is at the edge of the values tried ({listed}): "
            "widen the grid"
        )


@dataclass(frozen=True)
class Gap:
    """loss(series) - loss(baseline series) per seed at one (size, budget), each side at its selected value."""

    series: str
    baseline: str
    size: str
    tokens: Optional[int]
    series_value: Any
    baseline_value: Any
    seeds: tuple
    gaps: tuple

    @property
    def mean(self) -> float:
        return sum(self.gaps) / len(self.gaps)

    @property
    def std(self) -> Optional[float]:
        """Sample standard deviation over seeds (n - 1); None with one seed."""
        n = len(self.gaps)
        return math.sqrt(sum((g - self.mean) ** 2 for g in self.gaps) / (n - 1)) if n > 1 else None


def paired_gaps(
    records: list[RunRecord], sel: Selection, baseline_arch: str, loss: str = "final_val_loss"
) -> tuple[list[Gap], list[str]]:
    """Gaps of every non-baseline series to every baseline series at each shared (size, budget), paired by seed;
    notes for points where the two sides share no seed."""
    runs = {r.run_dir: r for r in records}
    choice = {(c.series, c.size, c.tokens): c for c in sel.choices}
    chosen: dict[tuple, dict] = defaultdict(dict)  # (series, size, tokens) -> seed -> loss at the selected value
    for d in sel.selected:
        r = runs[d]
        c = choice[(sel.series[d], size_of(r.model, r.arch), r.tokens)]
        chosen[(c.series, c.size, c.tokens)][r.seed] = getattr(r, loss)
    bases = sorted(s for s, a in sel.arch.items() if a == baseline_arch)
    others = sorted(s for s, a in sel.arch.items() if a != baseline_arch)
    gaps, notes = [], []
    for s in others:
        for b in bases:
            for (series, size, tokens), losses in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0)):
                if series != s or (b, size, tokens) not in chosen:
                    continue
                ref = chosen[(b, size, tokens)]
                seeds = tuple(sorted(set(losses) & set(ref), key=lambda x: (x is None, x or 0)))
                if not seeds:
                    notes.append(f"{s} vs {b} at {size}, {tokens:,} tokens: no seed in common; no gap")
                    continue
                gaps.append(
                    Gap(
                        s,
                        b,
                        size,
                        tokens,
                        choice[(s, size, tokens)].value,
                        choice[(b, size, tokens)].value,
                        seeds,
                        tuple(losses[x] - ref[x] for x in seeds),
                    )
                )
    return gaps, notes


def gap_dict(g: Gap, level: float = 0.9) -> dict:
    """A gap for fits.json, with the Student t interval of its mean over the seeds (paired.py; none from one seed)."""
    iv = mean_interval(list(g.gaps), level)
    return {
        "series": g.series,
        "baseline": g.baseline,
        "size": g.size,
        "tokens": g.tokens,
        "series_value": g.series_value,
        "baseline_value": g.baseline_value,
        "seeds": list(g.seeds),
        "gaps": list(g.gaps),
        "mean": g.mean,
        "min": min(g.gaps),
        "max": max(g.gaps),
        "std": g.std,
        "level": level,
        "low": iv.low if iv.n_valid else None,
        "high": iv.high if iv.n_valid else None,
    }


def selection_dict(sel: Selection) -> dict:
    return {
        "select": sel.select,
        "by": sel.by,
        "protocol": {**asdict(sel.protocol), "description": sel.protocol.describe()},
        "warnings": list(sel.warnings),
        "notes": list(sel.notes),
        "choices": [
            {
                "series": c.series,
                "size": c.size,
                "model": c.model,
                "tokens": c.tokens,
                "value": c.value,
                "values": list(c.values),
                "means": list(c.means),
                "seeds": c.seeds,
                "at_edge": c.at_edge,
                "optimum": c.optimum,
            }
            for c in sel.choices
        ],
    }


def baseline_series(sel: Selection, fits: dict, baseline_arch: str) -> Optional[str]:
    """The series ratios are taken against: the baseline arch's first fitted series."""
    return next((s for s in fits if sel.arch.get(s) == baseline_arch), None)


def under_trained_note(finished: list[RunRecord], sel: Selection, exclude: bool) -> Optional[str]:
    flagged = [r for r in finished if r.under_trained and r.run_dir in sel.selected]
    if not flagged:
        return None
    what = (
        "left out of the fits (exclude_undertrained=true; the L(N) table with them kept follows the main one)"
        if exclude
        else "kept in the fits (every run is reported; exclude_undertrained=true leaves them out)"
    )
    budgets: dict[tuple, list[int]] = {}  # one name per (series, size, seed), with its budgets (WSD branches: several)
    for r in sorted(flagged, key=lambda r: (sel.series[r.run_dir], _preset_order(r), r.seed or 0, r.tokens or 0)):
        budgets.setdefault((sel.series[r.run_dir], size_of(r.model, r.arch), r.seed), []).append(r.tokens or 0)
    names = "; ".join(
        f"{series} {size} seed {seed} at {', '.join(f'{t:,}' for t in tokens)} tokens"
        for (series, size, seed), tokens in list(budgets.items())[:4]
    )
    return f"{len(flagged)} selected run(s) do not beat the bigram baseline (under-trained), {what}: {names}" + (
        "; ..." if len(budgets) > 4 else ""
    )


def run_rows(finished: list[RunRecord], sel: Selection, fitted: set, loss: str) -> list[dict]:
    """Every finished run for the fits.md table: its series, size, budget, seed, selected value, loss, baselines and
    whether it was fitted."""
    rows = []
    for r in sorted(
        finished,
        key=lambda r: (
            sel.series[r.run_dir],
            _preset_order(r),
            r.tokens or 0,
            r.seed or 0,
            _order(r.axes.get(sel.select)) if sel.select else (),
        ),
    ):
        rows.append(
            {
                "series": sel.series[r.run_dir],
                "size": size_of(r.model, r.arch),
                "tokens": r.tokens,
                "seed": r.seed,
                "value": r.axes.get(sel.select) if sel.select else None,
                "loss": getattr(r, loss),
                "unigram": r.unigram_loss,
                "bigram": r.bigram_loss,
                "kn3": r.kn3_loss,
                "kn4": r.kn4_loss,
                "selected": r.run_dir in sel.selected,
                "under_trained": bool(r.under_trained),
                "fitted": r.run_dir in fitted,
                "run_dir": r.run_dir,
            }
        )
    return rows


def _preset_order(r: RunRecord) -> int:
    return r.block_params or r.total_params or 0


def runs_markdown(rows: list[dict], select: Optional[str]) -> list[str]:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.4f}"

    col = f" {short_label(select)} |" if select else ""
    lines = [
        "Runs (* selected; fitted: in a fit that was made; under-trained: final loss >= bigram):",
        "",
        f"| series | size | tokens | seed |{col} loss | unigram | bigram | KN 3-gram | KN 4-gram | mark |",
        "|---|---|---|---|" + ("---|" if select else "") + "---|---|---|---|---|---|",
    ]
    for w in rows:
        mark = ", ".join(
            m for m, on in (("*", w["selected"]), ("under-trained", w["under_trained"]), ("fitted", w["fitted"])) if on
        )
        val = f" {value_label(select, w['value'])} |" if select else ""
        lines.append(
            f"| {w['series']} | {w['size']} | {w['tokens']:,} | {w['seed']} |{val} {f(w['loss'])} | "
            f"{f(w['unigram'])} | {f(w['bigram'])} | {f(w.get('kn3'))} | {f(w.get('kn4'))} | {mark} |"
        )
    return lines


def gaps_markdown(gaps: list[dict], select: Optional[str]) -> list[str]:
    """The gap table: one row per (series, baseline, size, budget)."""
    if not gaps:
        return []
    what = f" at its own best {select}" if select else ""
    lines = [
        f"Paired gaps, loss(series) - loss(baseline) per seed, each side{what} (negative: the series is "
        "better); spread = min..max over seeds, std = sample std (n - 1); interval: Student t of the mean over the "
        "per-seed gaps:",
        "",
        "| series | baseline | size | tokens | seeds | gap per seed | mean [interval] | min..max | std |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in gaps:
        per = ", ".join(f"{x:+.4f}" for x in g["gaps"])
        std = "-" if g["std"] is None else f"{g['std']:.4f}"
        iv = f" [{g['low']:+.4f}, {g['high']:+.4f}]" if g.get("low") is not None else ""
        lines.append(
            f"| {g['series']} | {g['baseline']} | {g['size']} | {g['tokens']:,} | {len(g['seeds'])} | "
            f"{per} | {g['mean']:+.4f}{iv} | {g['min']:+.4f}..{g['max']:+.4f} | {std} |"
        )
    return lines


def choices_markdown(sel: dict) -> list[str]:
    """The selection table (from selection_dict): the metric's mean at every value tried, the chosen one in bold."""
    select = sel["select"]
    if select is None:
        return []
    label, by = short_label(select), sel.get("by", DEFAULT_SELECT_BY)
    best = "highest" if by in HIGHER_IS_BETTER else "lowest"
    proto = (sel.get("protocol") or {}).get("description", "protocol same")
    lines = [
        f"Selection over {select} ({proto}): mean {by} over seeds at each {label} tried, on the choosing seeds (the "
        f"{best} selected, in bold; under quadratic, the tried value nearest the fitted optimum); fits use the "
        "reported runs at it:",
        "",
        f"| series | size | tokens | {label}: mean {by} | fitted optimum | reported seeds |",
        "|---|---|---|---|---|---|",
    ]
    for c in sel["choices"]:
        cells = ", ".join(
            (f"**{value_label(select, v)}: {m:.4f}**" if v == c["value"] else f"{value_label(select, v)}: {m:.4f}")
            for v, m in zip(c["values"], c["means"])
        )
        edge = " (edge)" if c["at_edge"] else ""
        opt = "-" if c.get("optimum") is None else f"{c['optimum']:.4g}"
        lines.append(f"| {c['series']} | {c['size']} | {c['tokens']:,} | {cells}{edge} | {opt} | {c['seeds']} |")
    lines += [f"\nnote: {n}" for n in sel.get("notes", [])]
    lines += [f"\nWARNING: {w}" for w in sel["warnings"]]
    return lines
