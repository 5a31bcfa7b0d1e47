"""`diffllm eval compare runs=[a,b,...]`: one table and plots of every evaluation for several runs (the Diff vs
Transformer report after a sweep), with each run's stability record from training (spikes, skipped steps, max grad
norm: its summary.json). Each run's results are read from <run>/eval/*.json; a missing one is computed
first with the command's defaults (compute=false: leave it blank); what will be computed is said before it starts.
A row is labelled by the run's path below the runs' common folder (a sweep's `lr=0.008,lambda_init=0.8/seed1`).
The table and plots go to `out`, by default <the runs' common parent>/compare; stdout holds the table alone."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

from ..config import run_key_values
from ..runs import Run
from .common import EvalError, library_output_to_stderr, read_json_or_none, say, write_json
from .report import markdown


def _ppl(run: str) -> dict:
    from .ppl import PplConfig, run_ppl

    return run_ppl(PplConfig(run=run))


def _needle(run: str) -> dict:
    from .needle import NeedleConfig, run_needle

    return run_needle(NeedleConfig(run=run))


def _outliers(run: str) -> dict:
    from .outliers import OutliersConfig, run_outliers

    return run_outliers(OutliersConfig(run=run))


def _attention(run: str) -> dict:
    from .attention import AttentionConfig, run_attention

    return run_attention(AttentionConfig(run=run))


EVALS: dict[str, tuple[str, Callable[[str], dict]]] = {  # name -> (file in <run>/eval, how to compute it)
    "ppl": ("ppl.json", _ppl),
    "needle": ("needle-synthetic.json", _needle),
    "outliers": ("outliers.json", _outliers),
    "attention": ("attention.json", _attention),
}


@dataclass
class CompareConfig:
    """One table (markdown + JSON) and plots of ppl, needle, outliers and attention results for several runs, and
    the curves of `eval ppl by_position=true` and `eval icl` where a run has them (never computed here)."""

    # run directories ([a,b], a,b or a glob; sweep folder names with commas are kept whole)
    runs: List[str] = field(default_factory=list)
    # which results to show: ppl, needle, outliers, attention
    evals: List[str] = field(default_factory=lambda: list(EVALS))
    compute: bool = True  # compute a missing result (with the command's defaults) instead of leaving it blank
    out: Optional[str] = None  # folder for compare.{md,json,png}; null: <the runs' common parent folder>/compare


def _matches(item: str) -> list[str]:
    """The run directories `item` names: itself when it is one, else those it matches as a glob (sorted)."""
    if Path(item).is_dir():
        return [item]
    if any(ch in item for ch in "*?"):
        return sorted(p for p in glob.glob(item) if Path(p).is_dir())
    return []


def resolve_runs(items: List[str]) -> List[str]:
    """The run directories that `runs=` names. An unquoted list (`runs=[a,b]`, or `runs=a,b`) is split at every
    comma, the commas inside a sweep's directory names too (`lr=0.008,lambda_init=0.8`): neighbouring pieces that
    join, commas and all, into an existing directory (or a glob that matches some) are one item again; a glob stands
    for the directories it matches. Pieces that join in two ways are a one-line EvalError."""
    items = [piece for item in items for piece in item.split(",")]  # `runs=a,b` (no brackets) is one string
    runs: List[str] = []
    i = 0
    while i < len(items):
        found = [(j, m) for j in range(i + 1, len(items) + 1) if (m := _matches(",".join(items[i:j])))]
        if len(found) > 1:
            ways = " and ".join(repr(",".join(items[i:j])) for j, _ in found)
            raise EvalError(
                f"runs: {ways} both name run directories; quote each run to say which: runs=\"['a,b','c']\""
            )
        j, matched = found[0] if found else (i + 1, [items[i]])
        runs += matched
        i = j
    return runs


def labels(runs: List[str]) -> dict[str, str]:
    """{run: its path below the runs' common folder} (a sweep's `lr=0.008,lambda_init=0.8/seed1`, not `seed1`); one
    run, or one run given twice: its folder name."""
    paths = [Path(run).resolve() for run in runs]
    if len(set(paths)) < 2:
        return {run: path.name for run, path in zip(runs, paths)}
    common = Path(os.path.commonpath(paths))
    return {run: str(path.relative_to(common)) if path != common else path.name for run, path in zip(runs, paths)}


def missing(runs: List[str], evals: List[str]) -> dict[str, List[str]]:
    """{evaluation: [runs without its results file]} (only evaluations some run lacks)."""
    out: dict[str, List[str]] = {}
    for name in evals:
        lacking = [run for run in runs if not (Path(run) / "eval" / EVALS[name][0]).is_file()]
        if lacking:
            out[name] = lacking
    return out


TRAINING = ("spikes", "skipped_steps", "max_grad_norm")  # from the run's summary.json (diffllm/train/spikes.py)


def training(run: str) -> dict:
    """The run's stability record from its summary.json (None each for a run that has none, or predates them)."""
    summary = Run(run).summary() or {}
    return {key: summary.get(key) for key in TRAINING}


def collect(run: str, evals: List[str], compute: bool) -> dict:
    got = {}
    for name in evals:
        file, fn = EVALS[name]
        res = read_json_or_none(Path(run) / "eval" / file)
        if res is None and compute:
            say(f"{run}: computing {name}")
            with library_output_to_stderr():  # its own table: stdout is the compare table alone
                res = fn(run)
        got[name] = res
    return got


def uncomputed(run: str) -> dict:
    """The run's results that compare draws but never computes (their inputs are the user's choice): `eval ppl
    by_position=true` (ppl_by_position.json, None without) and `eval icl` ({task: icl-<task>.json})."""
    folder = Path(run) / "eval"
    icl = {p.stem[len("icl-") :]: read_json_or_none(p) for p in sorted(folder.glob("icl-*.json"))}
    return {"ppl_by_position": read_json_or_none(folder / "ppl_by_position.json"), "icl": icl}


def default_out(runs: List[str]) -> Path:
    """<the runs' common parent folder>/compare (a sweep's folder for the runs of a sweep)."""
    parents = [str(Path(run).resolve().parent) for run in runs]
    return Path(os.path.commonpath(parents)) / "compare"


def arch_step(run: str, r: dict) -> tuple:
    """(arch, step) of the results (the checkpoint they evaluated), else of the run's own files: config.yaml's
    model.arch (summary.json's arch) and the latest checkpoint's step (summary.json's steps); "?" where none says."""
    first = next((v for name, v in r.items() if v and name != "training"), {})
    arch, step = first.get("arch"), first.get("step")
    if arch is None or step is None:
        files = Run(run)
        summary, latest = files.summary() or {}, files.latest()
        arch = arch or ((files.config() or {}).get("model") or {}).get("arch") or summary.get("arch")
        step = step if step is not None else latest.step if latest is not None else summary.get("steps")
    return ("?" if arch is None else arch), ("?" if step is None else step)


def row(label: str, run: str, r: dict) -> list:
    def get(name, *path, default=float("nan")):
        node = r.get(name)
        for p in path:
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    import numpy as np

    src = get("ppl", "sources", default={})
    ppl = next(iter(src.values())) if src else {}
    att = get("attention", "by_depth", default={})
    return [
        label,
        *arch_step(run, r),
        ppl.get("loss", float("nan")),
        ppl.get("bits_per_byte", float("nan")),
        get("needle", "mean"),
        get("outliers", "attention_logits", "top1"),
        get("outliers", "hidden_states", "top1"),
        get("outliers", "quantised_loss", "4") - get("outliers", "quantised_loss", "fp32"),
        float(np.mean([np.mean(v["answer"]) for v in att.values()])) if att else float("nan"),
    ] + ["-" if r.get("training", {}).get(key) is None else r["training"][key] for key in TRAINING]


HEADER = [
    "run",
    "arch",
    "step",
    "loss",
    "bits/byte",
    "needle acc",
    "max abs logit",
    "max abs hidden",
    "4-bit loss increase",
    "attention to answer",
    "spikes",
    "skipped steps",
    "max grad norm",
]


def figure(results: dict, names: dict[str, str]):
    """Needle accuracy by N and attention to the answer by depth, one line per run, a panel for each kind of result
    some run has (None without any); one legend below the panels, so that long sweep labels cover no line."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("needle", "attention", "ppl_by_position", "icl") if any(r.get(k) for r in results.values())]
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.5), squeeze=False)
    panels = dict(zip(kinds, axes[0]))
    for i, (run, r) in enumerate(results.items()):
        line = dict(marker="o", label=names[run], color=f"C{i % 10}")  # a run's colour is the same in both panels
        if r.get("needle"):
            by_n = r["needle"]["by_n"]
            panels["needle"].plot([int(n) for n in by_n], list(by_n.values()), **line)
        if r.get("attention"):
            bd = r["attention"]["by_depth"]
            panels["attention"].plot([float(d) for d in bd], [np.mean(v["answer"]) for v in bd.values()], **line)
        if r.get("ppl_by_position"):
            by_position_lines(panels["ppl_by_position"], r["ppl_by_position"], line)
        for k, (task, res) in enumerate((r.get("icl") or {}).items()):  # accuracy by k, its interval over queries
            style = {**line, "ls": ("-", ":", "-.")[k % 3], **({"label": f"{line['label']} ({task})"} if k else {})}
            ks, by_k = [int(x) for x in res["by_k"]], list(res["by_k"].values())
            err = [[b["accuracy"] - b["interval"][0] for b in by_k], [b["interval"][1] - b["accuracy"] for b in by_k]]
            panels["icl"].errorbar(ks, [b["accuracy"] for b in by_k], yerr=err, capsize=3, **style)
    if "needle" in panels:
        ns = sorted({int(n) for r in results.values() if r.get("needle") for n in r["needle"]["by_n"]})
        panels["needle"].set_xticks(ns)  # the numbers of needles evaluated: no 1.5 needles
        panels["needle"].set(xlabel="needles N", ylabel="accuracy", title="multi-needle retrieval", ylim=(0, 1))
    if "attention" in panels:
        panels["attention"].set(xlabel="answer depth (%)", ylabel="attention to answer", title="attention allocation")
    if "ppl_by_position" in panels:
        title = "NLL by position (dashed: training length)"
        panels["ppl_by_position"].set(xscale="log", xlabel="position", ylabel="cumulative average NLL", title=title)
    if "icl" in panels:
        ks = sorted({int(k) for r in results.values() for res in (r.get("icl") or {}).values() for k in res["by_k"]})
        panels["icl"].set(xscale="symlog", xlabel="demonstrations k", ylabel="accuracy", title="in-context learning")
        panels["icl"].set_xticks(ks, [str(k) for k in ks])  # the k evaluated, on a log-like axis that holds 0
    by_label = {}
    for ax in axes[0]:  # every run once, whichever panel it has results in
        by_label.update({label: h for h, label in zip(*ax.get_legend_handles_labels())})
    fig.tight_layout()
    fig.legend(
        list(by_label.values()), list(by_label), loc="upper center", bbox_to_anchor=(0.5, 0), ncol=min(3, len(by_label))
    )
    return fig


def by_position_lines(ax, res: dict, line: dict) -> None:
    """A run's cumulative average NLL curve per source (`eval ppl by_position=true`), a dotted line style for each
    further source, and a dashed vertical line in its colour at its training length when it extrapolates past it."""
    for k, (src, s) in enumerate(res["sources"].items()):
        curve = s["cumulative_nll"]
        style = {**line, "marker": None, "ls": ("-", ":", "-.")[k % 3]}
        if k:
            style["label"] = f"{line['label']} ({src})"
        ax.plot(range(1, len(curve) + 1), curve, **style)
    if res.get("extrapolation"):
        ax.axvline(res["train_seq_len"], color=line["color"], ls="--", lw=0.8)


def plots(results: dict, names: dict[str, str], folder: Path) -> list[Path]:
    """compare.png (`figure`); with nothing to plot none, and an older one is removed."""
    path = folder / "compare.png"
    fig = figure(results, names)
    if fig is None:
        path.unlink(missing_ok=True)
        return []
    import matplotlib.pyplot as plt  # (figure chose the Agg backend)

    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [path]


def run_compare(c: CompareConfig) -> dict:
    if not c.runs:
        raise EvalError("runs: missing; pass runs=[<run dir>,<run dir>,...]")
    unknown = [e for e in c.evals if e not in EVALS]
    if unknown:
        raise EvalError(f"evals: unknown {unknown[0]!r} (known: {', '.join(EVALS)})")
    runs = resolve_runs(c.runs)
    for run in runs:
        if not Path(run).is_dir():
            raise EvalError(f"runs: {run}: no such directory")
    names = labels(runs)
    todo = missing(runs, c.evals)
    if todo and c.compute:
        n = sum(len(r) for r in todo.values())
        say(
            f"computing {n} missing evaluation(s) with each command's defaults (a few minutes each on CPU; "
            f"compute=false leaves them blank): "
            + "; ".join(f"{name} for {', '.join(names[r] for r in lacking)}" for name, lacking in todo.items())
        )
    elif todo:
        say(
            "left blank (compute=false): "
            + "; ".join(f"{name} for {', '.join(names[r] for r in lacking)}" for name, lacking in todo.items())
        )
    results = {run: {**collect(run, c.evals, c.compute), **uncomputed(run), "training": training(run)} for run in runs}
    folder = Path(c.out) if c.out else default_out(runs)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown(HEADER, [row(names[run], run, r) for run, r in results.items()])
    (folder / "compare.md").write_text(table + "\n")
    write_json(folder / "compare.json", results)
    png = plots(results, names, folder)
    print(table)
    nothing = " (no needle, attention, by-position NLL or ICL results to plot: no compare.png)"
    say(f"wrote {folder}/compare.{{md,json,png}}" if png else f"wrote {folder}/compare.{{md,json}}{nothing}")
    return results


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval compare", CompareConfig, run_compare, argv)


if __name__ == "__main__":
    main()
