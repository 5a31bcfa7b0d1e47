"""`diffllm eval compare runs=[a,b,...]`: one table and plots of every evaluation for several runs (the Diff vs
Transformer report after a sweep), with each run's stability record from training (spikes, skipped steps, max grad
norm: its summary.json). Each run's results are read from <run>/eval/*.json; a missing one is computed
first with the command's defaults (compute=false: leave it blank); what will be computed is said before it starts.
The table and plots go to `out`, by default <the runs' common parent>/compare."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from ..config import run_key_values
from ..runs import Run
from .common import EvalError, read_json_or_none, say, write_json
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
    """One table (markdown + JSON) and plots of ppl, needle, outliers and attention results for several runs."""

    runs: List[str] = field(default_factory=list)
    evals: List[str] = field(default_factory=lambda: list(EVALS))
    compute: bool = True  # compute a missing result (with the command's defaults) instead of leaving it blank
    out: Optional[str] = None  # folder for compare.{md,json,png}; null: <the runs' common parent folder>/compare


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
            res = fn(run)
        got[name] = res
    return got


def default_out(runs: List[str]) -> Path:
    """<the runs' common parent folder>/compare (a sweep's folder for the runs of a sweep)."""
    parents = [str(Path(run).resolve().parent) for run in runs]
    return Path(os.path.commonpath(parents)) / "compare"


def row(run: str, r: dict) -> list:
    def get(name, *path, default=float("nan")):
        node = r.get(name)
        for p in path:
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    first = next((v for name, v in r.items() if v and name != "training"), {})
    src = get("ppl", "sources", default={})
    ppl = next(iter(src.values())) if src else {}
    att = get("attention", "by_depth", default={})
    return [
        Path(run).name,
        first.get("arch", "?"),
        first.get("step", "?"),
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


def plots(results: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    for run, r in results.items():
        label = f"{Path(run).name}"
        if r.get("needle"):
            by_n = r["needle"]["by_n"]
            a1.plot([int(n) for n in by_n], list(by_n.values()), marker="o", label=label)
        if r.get("attention"):
            bd = r["attention"]["by_depth"]
            a2.plot([float(d) for d in bd], [np.mean(v["answer"]) for v in bd.values()], marker="o", label=label)
    a1.set(xlabel="needles N", ylabel="accuracy", title="multi-needle retrieval", ylim=(0, 1))
    a2.set(xlabel="answer depth (%)", ylabel="attention to answer", title="attention allocation")
    for ax in (a1, a2):
        if ax.get_legend_handles_labels()[0]:  # no results of this kind: no empty legend
            ax.legend(fontsize=7)
    path = folder / "compare.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    made.append(path)
    return made


def run_compare(c: CompareConfig) -> dict:
    if not c.runs:
        raise EvalError("runs: missing; pass runs=[<run dir>,<run dir>,...]")
    unknown = [e for e in c.evals if e not in EVALS]
    if unknown:
        raise EvalError(f"evals: unknown {unknown[0]!r} (known: {', '.join(EVALS)})")
    for run in c.runs:
        if not Path(run).is_dir():
            raise EvalError(f"runs: {run}: no such directory")
    todo = missing(c.runs, c.evals)
    if todo and c.compute:
        n = sum(len(r) for r in todo.values())
        say(
            f"computing {n} missing evaluation(s) with each command's defaults (a few minutes each on CPU; "
            f"compute=false leaves them blank): "
            + "; ".join(f"{name} for {', '.join(Path(r).name for r in runs)}" for name, runs in todo.items())
        )
    elif todo:
        say(
            "left blank (compute=false): "
            + "; ".join(f"{name} for {', '.join(Path(r).name for r in runs)}" for name, runs in todo.items())
        )
    results = {run: {**collect(run, c.evals, c.compute), "training": training(run)} for run in c.runs}
    folder = Path(c.out) if c.out else default_out(c.runs)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown(HEADER, [row(run, r) for run, r in results.items()])
    (folder / "compare.md").write_text(table + "\n")
    write_json(folder / "compare.json", results)
    plots(results, folder)
    print(table)
    say(f"wrote {folder}/compare.{{md,json,png}}")
    return results


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval compare", run_compare, argv)


if __name__ == "__main__":
    main()
