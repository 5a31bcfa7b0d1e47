"""Compute-optimal scaling from a joint fit L(N, D) = E + A N^-alpha + B D^-beta, with training compute C = f(N) D:

    f(N)      training FLOPs per token at N: model_stats' count (6 x matmul params + the variant's attention FLOPs) at
              each run's data.seq_len, known at the sizes that ran; between and beyond them f(N) = f1 N + f0 fitted
              on the series' own sizes (relative least squares; f = 6N stays 6N; at micro scale, where the output
              head and attention are a third of f, the line is within a few % of every size: fits.json says how far)
    L*(C)     = min over N of L(N, C / f(N))                                      the frontier
    N_opt(C)  = its argmin, D_opt(C) = C / f(N_opt(C)); N_opt ~ C^a, D_opt ~ C^b  (a, b: least squares in log-log
              over a grid of C spanning the runs' compute)
    C(L)      = min over N of f(N) (B / (L - E - A N^-alpha))^(1/beta)             the compute that reaches loss L
              (over the N with E + A N^-alpha < L; inf when L <= E: never)

For f(N) = 6N the frontier is Chinchilla's closed form N_opt = G (C/6)^(beta/(alpha+beta)),
G = (alpha A / (beta B))^(1/(alpha+beta)) (tests/scaling/test_optimal.py). Both minimisations run on a log grid of N
from N_SPAN below the smallest size to N_SPAN above the largest, zoomed three times around the best point; an argmin
on the edge of that range is no optimum (nan, counted in a note). The compute ratio at equal loss: the compute a
series needs to reach the baseline's frontier loss at C_ref, over C_ref (< 1: cheaper); its interval pairs the two
series' joint-fit bootstrap replicates, as the other ratios do. The effective compute multiplier at matched loss is
its inverse, C_ref over the compute the series needs for the baseline's L*(C_ref) (> 1: the series is worth that many
times the baseline's compute), with its interval from paired replicates (both series refitted on one draw of seeds,
fit.py paired_joint) where the sweep has them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..results import RunRecord, saved_model_stats
from ..runs import Run
from .fit import Interval, JointLaw, interval, no_interval

N_SPAN = 1e4  # the N search range: [smallest size / N_SPAN, largest size * N_SPAN]


@dataclass(frozen=True)
class FlopsPerToken:
    """f(N) = slope N + intercept, fitted to the (N, f) of the sizes that ran by least squares in relative error (one
    size: proportional). Smooth on purpose: an interpolant with kinks at the sizes pins optima to them."""

    slope: float
    intercept: float
    n: tuple[float, ...]  # the sizes, increasing
    f: tuple[float, ...]  # their FLOPs per token (the mean where runs of a size differ, e.g. in seq_len)

    @classmethod
    def fit(cls, n, f) -> FlopsPerToken:
        n, f = np.asarray(n, dtype=float), np.asarray(f, dtype=float)
        sizes = np.unique(n)
        mean = np.array([f[n == s].mean() for s in sizes])
        if len(sizes) == 1:
            return cls(float(mean[0] / sizes[0]), 0.0, tuple(sizes), tuple(mean))
        X = np.stack([sizes, np.ones_like(sizes)], 1) / mean[:, None]  # rows scaled by 1/f: relative residuals
        (slope, intercept), *_ = np.linalg.lstsq(X, np.ones_like(sizes), rcond=None)
        return cls(float(slope), float(intercept), tuple(sizes), tuple(mean))

    def __call__(self, n):
        """f(N); nan where the line is not positive (no compute there)."""
        f = self.slope * np.asarray(n, dtype=float) + self.intercept
        return np.where(f > 0, f, np.nan)

    @property
    def max_rel_error(self) -> float:
        """The largest |f(N) / f - 1| over the sizes that ran."""
        return float(np.max(np.abs(self(np.array(self.n)) / np.array(self.f) - 1)))


def _argmin_log_n(
    fun: Callable[[np.ndarray], np.ndarray], k: int, lo: float, hi: float, points: int = 801, zooms: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise minimum of fun over N in [lo, hi]: fun maps N (k, M) -> values (k, M) (nan/inf: infeasible).
    Returns (N at the minimum, the minimum), each (k,); nan N where the minimum sits on the range's edge."""
    rows = np.arange(k)
    grid = np.broadcast_to(np.linspace(np.log(lo), np.log(hi), points), (k, points))
    step = grid[0, 1] - grid[0, 0]
    with np.errstate(all="ignore"):
        v = np.nan_to_num(fun(np.exp(grid)), nan=np.inf)
        i = np.argmin(v, axis=1)
        edge = (i == 0) | (i == points - 1) | ~np.isfinite(v[rows, i])
        best, val = grid[rows, i], v[rows, i]
        for _ in range(zooms):
            grid = best[:, None] + np.linspace(-step, step, 41)[None, :]
            v = np.nan_to_num(fun(np.exp(grid)), nan=np.inf)
            i = np.argmin(v, axis=1)
            better = v[rows, i] <= val
            best, val = np.where(better, grid[rows, i], best), np.where(better, v[rows, i], val)
            step /= 20
    return np.where(edge, np.nan, np.exp(best)), val


@dataclass(frozen=True)
class Frontier:
    C: np.ndarray  # (K,) training FLOPs
    loss: np.ndarray  # (K,) L*(C)
    N_opt: np.ndarray  # (K,) nan where the optimum is outside the search range
    D_opt: np.ndarray  # (K,)


def frontier(law: JointLaw, f: FlopsPerToken, C) -> Frontier:
    C = np.atleast_1d(np.asarray(C, dtype=float))
    n_opt, loss = _argmin_log_n(lambda n: law(n, C[:, None] / f(n)), len(C), f.n[0] / N_SPAN, f.n[-1] * N_SPAN)
    return Frontier(C, loss, n_opt, C / f(n_opt))


def compute_to_reach(law: JointLaw, f: FlopsPerToken, loss) -> np.ndarray:
    """C(L) for each loss: inf when the law never gets there (L <= E), nan when the cheapest N is off the range."""
    target = np.atleast_1d(np.asarray(loss, dtype=float))

    def cost(n):
        gap = target[:, None] - law.E - law.A * n**-law.alpha
        return np.where(gap > 0, f(n) * (law.B / gap) ** (1 / law.beta), np.inf)  # nan f: no compute there

    n_best, c = _argmin_log_n(cost, len(target), f.n[0] / N_SPAN, f.n[-1] * N_SPAN)
    never = target <= law.E
    return np.where(never, np.inf, np.where(np.isnan(n_best), np.nan, c))


def exponents(fr: Frontier) -> tuple[float, float]:
    """(a, b) of N_opt ~ C^a, D_opt ~ C^b: least-squares slopes in log-log over the frontier's grid (nan if any
    optimum is off the range)."""
    if not (np.isfinite(fr.N_opt).all() and len(fr.C) > 1):
        return float("nan"), float("nan")
    lc = np.log(fr.C)
    return float(np.polyfit(lc, np.log(fr.N_opt), 1)[0]), float(np.polyfit(lc, np.log(fr.D_opt), 1)[0])


# -------------------------------------------------------------------------------------- from a sweep's runs
def run_flops_per_token(r: RunRecord) -> Optional[float]:
    """The run's training FLOPs per token, counted by model_stats from the model and data.seq_len its config.yaml
    saved (as the trainer counts them); else its summary's flops / tokens; None without either."""
    config = Run(r.run_dir).config() or {}
    if config.get("model"):
        seq_len = (config.get("data") or {}).get("seq_len")
        counted = saved_model_stats(config["model"], seq_len)
        if counted and counted[0].flops_per_token:
            return counted[0].flops_per_token
    return r.flops / r.tokens if r.flops and r.tokens else None


@dataclass
class SeriesRuns:
    """A series' fitted runs in compute terms: N, tokens D, FLOPs per token f, C = f D, final loss (each (P,))."""

    N: np.ndarray
    D: np.ndarray
    f: np.ndarray
    loss: np.ndarray
    under: Optional[np.ndarray] = None  # (P,) bool: the run is under-trained (the figures draw it open)

    @property
    def C(self) -> np.ndarray:
        return self.f * self.D


@dataclass
class OptimalPlot:
    """What the compute-optimal figures draw: per series its runs, its frontier on a dense grid of C, and its
    iso-FLOP curves L(N, C_k / f(N)) with their optima; the iso-FLOP budgets C_k."""

    runs: dict[str, SeriesRuns]
    frontiers: dict[str, Frontier]
    iso_C: np.ndarray
    iso: dict[str, tuple[np.ndarray, np.ndarray, Frontier]]  # series -> (N grid (M,), loss (k, M), optima)


def _iv(value: float, samples, level: float, exact: bool) -> Interval:
    return no_interval(value) if exact else interval(value, samples, level)


def _series_table(law, boot, f, C, c_ref, level, exact) -> tuple[dict, list, int]:
    """The series' frontier at C_ref and on the grid C, with intervals; also its replicates' frontier losses at
    C_ref (for the ratio) and how many replicates had an optimum off the search range."""
    best, reps = frontier(law, f, C), [frontier(b, f, C) for b in boot]
    best_ref, reps_ref = frontier(law, f, c_ref), [frontier(b, f, c_ref) for b in boot]
    off = sum(int(np.isnan(r.N_opt).any() or np.isnan(q.N_opt).any()) for r, q in zip(reps, reps_ref))

    def at(fr: Frontier, replicates: list[Frontier], k: int) -> dict:
        return {
            "C": float(fr.C[k]),
            **{
                key: _iv(float(getattr(fr, key)[k]), [getattr(r, key)[k] for r in replicates], level, exact)
                for key in ("loss", "N_opt", "D_opt")
            },
        }

    a, b = exponents(best)
    boot_ab = [exponents(r) for r in reps]
    row = {
        "flops_per_token": {
            "N": list(f.n),
            "f": list(f.f),
            "f1": f.slope,
            "f0": f.intercept,
            "max_rel_error": f.max_rel_error,
        },
        "at_ref": at(best_ref, reps_ref, 0),
        "grid": [at(best, reps, k) for k in range(len(C))],
        "a": _iv(a, [x for x, _ in boot_ab], level, exact),
        "b": _iv(b, [y for _, y in boot_ab], level, exact),
    }
    return row, [float(r.loss[0]) for r in reps_ref], off


def compute_optimal(
    runs: dict[str, SeriesRuns],
    joint: dict[str, JointLaw],
    boot: dict[str, list[JointLaw]],
    exact: set,
    base: Optional[str],
    level: float,
    grid_points: int = 5,
    c_ref: Optional[float] = None,
    pairs: Optional[dict] = None,
) -> tuple[dict, list[str], OptimalPlot]:
    """Per series with a joint fit: the frontier at C_ref and on `grid_points` values of C from the smallest to the
    largest run's compute, the exponents a and b, and (against `base`) the compute ratio at equal loss at C_ref and
    the effective compute multiplier (pairs: series -> (baseline replicates, its replicates) drawn together; a series
    without them pairs the two series' own replicates by index). C_ref: given, else the baseline's largest run's
    compute (else the largest run's). Returns (the table for fits.json, notes, the figures' data)."""
    notes: list[str] = []
    fitted = [s for s in runs if s in joint]
    all_c = np.concatenate([runs[s].C for s in fitted])
    C = np.geomspace(all_c.min(), all_c.max(), grid_points)
    source = "compute_ref" if c_ref else f"the largest {base} run" if base in fitted else "the largest run"
    c_ref = float(c_ref or (runs[base].C.max() if base in fitted else all_c.max()))
    flops = {s: FlopsPerToken.fit(runs[s].N, runs[s].f) for s in fitted}
    table, ref_losses = {}, {}
    for s in fitted:
        table[s], ref_losses[s], off = _series_table(joint[s], boot[s], flops[s], C, c_ref, level, s in exact)
        if off:
            notes.append(
                f"compute-optimal {s}: in {off}/{len(boot[s])} bootstrap replicates the optimal N lies "
                f"outside [{flops[s].n[0] / N_SPAN:.3g}, {flops[s].n[-1] * N_SPAN:.3g}] (no optimum "
                "there): those replicates are left out of the N_opt, D_opt and exponent intervals"
            )
    if base in fitted:
        target = table[base]["at_ref"]["loss"].value
        for s in (x for x in fitted if x != base):
            value = float(compute_to_reach(joint[s], flops[s], target)[0]) / c_ref
            samples = [float(compute_to_reach(o, flops[s], t)[0]) / c_ref for o, t in zip(boot[s], ref_losses[base])]
            table[s]["compute_ratio"] = _iv(value, samples, level, bool({s, base} & exact))
            both = (pairs or {}).get(s)
            pair_boot = both or (boot[base], boot[s])
            multiplier = [compute_multiplier(b, flops[base], o, flops[s], c_ref) for b, o in zip(*pair_boot)]
            table[s]["multiplier"] = _iv(1 / value if value else np.inf, multiplier, level, bool({s, base} & exact))
            table[s]["multiplier_paired"] = both is not None
            if value == np.inf:
                notes.append(
                    f"compute-optimal {s}: never reaches {base}'s frontier loss {target:.4f} at C_ref = "
                    f"{c_ref:.3g} FLOPs (its fitted E = {joint[s].E:.4f}): compute ratio inf"
                )
    dense = np.geomspace(all_c.min() / 2, all_c.max() * 2, 60)
    iso_C = np.geomspace(all_c.min(), all_c.max(), 4)
    iso = {}
    for s in fitted:
        n = np.geomspace(runs[s].N.min() / 4, runs[s].N.max() * 4, 120)
        iso[s] = (n, joint[s](n[None, :], iso_C[:, None] / flops[s](n)[None, :]), frontier(joint[s], flops[s], iso_C))
    plot = OptimalPlot({s: runs[s] for s in runs}, {s: frontier(joint[s], flops[s], dense) for s in fitted}, iso_C, iso)
    return (
        {"C_ref": c_ref, "C_ref_source": source, "baseline": base if base in fitted else None, "series": table},
        notes,
        plot,
    )


def compute_multiplier(base: JointLaw, f_base: FlopsPerToken, law: JointLaw, f: FlopsPerToken, c_ref: float) -> float:
    """C_ref / the compute `law` needs to reach the loss of `base`'s frontier at C_ref (0 where it never does)."""
    need = float(compute_to_reach(law, f, float(frontier(base, f_base, c_ref).loss[0]))[0])
    return c_ref / need if need > 0 else np.inf


def _beyond(n_opt: Interval, sizes) -> str:
    """A flag for an optimum outside the sizes that ran: an extrapolation of the fit, not a measured optimum."""
    if n_opt.value > max(sizes):
        return " (FLAG: beyond the largest size)"
    return " (FLAG: below the smallest size)" if n_opt.value < min(sizes) else ""


def optimal_markdown(opt: Optional[dict]) -> list[str]:
    """fits.md's compute-optimal section: the table at C_ref, then the frontier on the grid of C."""
    if not opt:
        return []
    base = opt["baseline"]
    lines = [
        "",
        f"Compute-optimal: C = training FLOPs per token (model_stats at each run's seq_len: 6 x matmul "
        f"params + attention) x tokens; at C_ref = {opt['C_ref']:.4g} FLOPs ({opt['C_ref_source']}):",
        "",
        "| series | f(N) = f1 N + f0 (worst error at a size) | L*(C_ref) | N_opt | D_opt | a: N_opt ~ C^a | "
        f"b: D_opt ~ C^b | compute for {base or 'the baseline'}'s L*(C_ref) / C_ref | effective compute "
        "multiplier |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, row in opt["series"].items():
        ref, f = row["at_ref"], row["flops_per_token"]
        ratio = row.get("compute_ratio", "1 (baseline)" if s == base else "- (no baseline fit)")
        mult = row.get("multiplier_refused") and "refused: not identified"
        mult = mult or row.get("multiplier", "1 (baseline)" if s == base else "-")
        mult = f"{mult}{'' if row.get('multiplier_paired', True) else ' unpaired'}"
        lines.append(
            f"| {s} | {f['f1']:.4g} N + {f['f0']:.4g} ({f['max_rel_error']:.1%}) | {ref['loss']} | "
            f"{ref['N_opt']}{_beyond(ref['N_opt'], f['N'])} | {ref['D_opt']} | {row['a']} | {row['b']} | {ratio} | "
            f"{mult} |"
        )
    lines += [
        "",
        "The frontier L*(C) = min_N L(N, C / f(N)) over the runs' compute:",
        "",
        "| series | C | L*(C) | N_opt | D_opt |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s} | {g['C']:.4g} | {g['loss']} | {g['N_opt']}{_beyond(g['N_opt'], row['flops_per_token']['N'])} | "
        f"{g['D_opt']} |"
        for s, row in opt["series"].items()
        for g in row["grid"]
    ]
    return lines
