"""`scaling fit predict=<size>@<tokens>`: a prediction made before the runs that test it (issue 32 §4). Each series'
L(N, D) fit gives the final loss of its arch's preset of that size (`<arch>-<size>`, its own N) trained on that many
tokens, with the bootstrap interval of its replicates, and each series' gap to the baseline series with the interval
of the replicate differences (the two series' replicates are independent draws, paired by index). Commit the
report; once the size has trained, `scaling fit holdout=<size>` on the sweep that holds it refits the same runs (same
seeds, same replicates) and scores the same predictions against the measured runs."""

from __future__ import annotations

from typing import Callable, Optional

from ..counts import parse_count
from ..errors import UserError
from ..model.accounting import model_stats
from ..model.presets import load_preset, preset_names
from ..results import kaplan_n
from .fit import interval


def parse(spec: str) -> tuple[str, int]:
    """`micro-6@6.8M` -> ("micro-6", 6800000); anything else is a one-line error."""
    size, at, tokens = str(spec).partition("@")
    if not (size and at and tokens):
        raise UserError(f"predict={spec}: expected <size>@<tokens>, e.g. predict=micro-6@6.8M")
    return size, parse_count(tokens, f"predict={spec}")


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
        preset_n(arch, parse(spec)[0], params)


def predictions(spec: str, params: str, joint: dict, joint_boot: dict, base: Optional[str], level: float) -> list[dict]:
    """One row per series with an L(N, D) fit: its preset, N, D, the predicted loss [interval] and, but for the
    baseline's row, the gap to the baseline's prediction [interval]."""
    size, tokens = parse(spec)
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


def markdown(spec: str, rows: list[dict], level: float) -> list[str]:
    if not rows:
        return []
    lines = [
        f"Prediction (predict={spec}), from L(N, D) before any run of this size; {level:.0%} bootstrap intervals:",
        "",
        "| series | preset | N | D | predicted loss [interval] | gap to baseline [interval] |",
        "|---|---|---|---|---|---|",
    ]
    for w in rows:
        gap = f"{w['gap']:+.4f} [{w['gap_low']:+.4f}, {w['gap_high']:+.4f}]" if "gap" in w else "(baseline)"
        lines.append(
            f"| {w['series']} | {w['preset']} | {w['N']:,} | {w['D']:,} | "
            f"{w['loss']:.4f} [{w['loss_low']:.4f}, {w['loss_high']:.4f}] | {gap} |"
        )
    return lines
