"""Scaling-law fits with numpy only: L(N) = E + A N^-alpha and L(N, D) = E + A N^-alpha + B D^-beta by profiling the
exponents on a grid (the rest is linear least squares with E, A, B >= 0), bootstrap intervals (L(N): over runs,
diffllm/scaling/resample.py; L(N, D): residual), and the
parameter (or token) ratio at equal loss between two fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import UserError
from .resample import resamplable, strata, take, uniforms

ALPHAS = np.concatenate([np.linspace(0.005, 0.1, 39, endpoint=False), np.linspace(0.1, 3.0, 300)])


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = E + A x^-alpha (x: parameters or tokens)."""

    E: float
    A: float
    alpha: float

    def __call__(self, x):
        return self.E + self.A * np.asarray(x, dtype=float) ** -self.alpha

    def inverse(self, loss: float) -> float:
        """The x at which the law reaches `loss` (inf when loss <= E: never)."""
        if loss <= self.E or self.A <= 0:
            return float("inf")
        try:  # a nearly flat law (alpha -> 0) needs an x beyond any float: never, in practice
            return float(((loss - self.E) / self.A) ** (-1.0 / self.alpha))
        except (OverflowError, ZeroDivisionError):
            return float("inf")


@dataclass(frozen=True)
class JointLaw:
    """L(N, D) = E + A N^-alpha + B D^-beta."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def __call__(self, n, d):
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        return self.E + self.A * n**-self.alpha + self.B * d**-self.beta

    def at_params(self, n: float) -> PowerLaw:
        """L(D) at fixed N: E' = E + A N^-alpha."""
        return PowerLaw(self.E + self.A * n**-self.alpha, self.B, self.beta)

    def at_tokens(self, d: float) -> PowerLaw:
        return PowerLaw(self.E + self.B * d**-self.beta, self.A, self.alpha)


def _nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batched least squares y ~ X c with c >= 0, for small column counts: every subset of active columns is solved
    and the best feasible one kept. X: (G, P, K), y: (P,) -> coefficients (G, K), sum of squared residuals (G,)."""
    G, P, K = X.shape
    best_c, best_sse = np.zeros((G, K)), np.full(G, np.inf)
    for mask in range(1, 2**K):
        cols = [k for k in range(K) if mask >> k & 1]
        Xs = X[:, :, cols]
        XtX = np.einsum("gpi,gpj->gij", Xs, Xs) + 1e-12 * np.eye(len(cols))
        c = np.linalg.solve(XtX, np.einsum("gpi,p->gi", Xs, y)[..., None])[..., 0]
        sse = ((np.einsum("gpi,gi->gp", Xs, c) - y) ** 2).sum(1)
        ok = (c >= 0).all(1) & (sse < best_sse)
        full = np.zeros((G, K))
        full[:, cols] = c
        best_c[ok], best_sse[ok] = full[ok], sse[ok]
    return best_c, best_sse


def _scale(x: np.ndarray) -> float:
    return float(np.exp(np.log(x).mean()))  # the geometric mean keeps x/x0 near 1 for any units


def fit_power_law(x, loss, alphas: np.ndarray = ALPHAS) -> PowerLaw:
    x, y = np.asarray(x, dtype=float), np.asarray(loss, dtype=float)
    if len(x) < 3 or len(np.unique(x)) < 2:
        raise UserError(f"a power-law fit needs >= 3 points at >= 2 sizes (got {len(x)} at {len(np.unique(x))})")
    x0 = _scale(x)
    feats = (x / x0)[None, :] ** -alphas[:, None]  # (G, P)
    X = np.stack([np.ones_like(feats), feats], axis=-1)
    c, sse = _nonneg_lstsq(X, y)
    alphas, c, sse = _refine(
        alphas, c, sse, lambda a: np.stack([np.ones((len(a), len(x))), (x / x0)[None, :] ** -a[:, None]], axis=-1), y
    )
    g = int(np.argmin(sse))
    return PowerLaw(float(c[g, 0]), float(c[g, 1] * x0 ** alphas[g]), float(alphas[g]))


def _refine(alphas, c, sse, design, y, rounds: int = 3):
    """Zoom the 1-D exponent grid around the best value a few times."""
    for _ in range(rounds):
        g = int(np.argmin(sse))
        lo, hi = alphas[max(g - 1, 0)], alphas[min(g + 1, len(alphas) - 1)]
        fine = np.linspace(lo, hi, 41)
        cf, sf = _nonneg_lstsq(design(fine), y)
        alphas, c, sse = np.concatenate([alphas, fine]), np.concatenate([c, cf]), np.concatenate([sse, sf])
    return alphas, c, sse


def fit_joint(n, d, loss, alphas: np.ndarray | None = None) -> JointLaw:
    n, d, y = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if len(y) < 5 or len(np.unique(n)) < 2 or len(np.unique(d)) < 2:
        raise UserError(
            f"L(N, D) needs >= 5 points over >= 2 sizes and >= 2 token counts (got {len(y)} points, "
            f"{len(np.unique(n))} sizes, {len(np.unique(d))} token counts)"
        )
    n0, d0 = _scale(n), _scale(d)
    grid_a = grid_b = np.linspace(0.02, 2.0, 60) if alphas is None else alphas
    best = None
    for _ in range(4):  # a coarse exponent grid, then three zooms around the best pair
        a, b = (g.ravel() for g in np.meshgrid(grid_a, grid_b, indexing="ij"))
        X = np.stack([np.ones((len(a), len(y))), (n / n0)[None] ** -a[:, None], (d / d0)[None] ** -b[:, None]], -1)
        c, sse = _nonneg_lstsq(X, y)
        g = int(np.argmin(sse))
        if best is None or sse[g] <= best[0]:
            best = (sse[g], a[g], b[g], c[g])
        wa, wb = 2 * (grid_a[1] - grid_a[0]), 2 * (grid_b[1] - grid_b[0])
        grid_a = np.linspace(max(best[1] - wa, 1e-3), best[1] + wa, 21)
        grid_b = np.linspace(max(best[2] - wb, 1e-3), best[2] + wb, 21)
    _, a, b, c = best
    return JointLaw(float(c[0]), float(c[1] * n0**a), float(a), float(c[2] * d0**b), float(b))


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float
    n_valid: int  # bootstrap replicates that gave a finite value
    n_total: int = 0  # bootstrap replicates in all
    exact: bool = False  # the fit had no more points than parameters: it passes through them, no interval exists

    def __str__(self) -> str:
        value = "never (inf)" if self.value == float("inf") else f"{self.value:.4g}"
        if self.exact:
            return f"{value} (exactly determined: no interval)"
        if not self.n_valid:
            return f"{value} [no finite replicate]"
        spread = f"[{self.low:.4g}, {self.high:.4g}]"
        return f"{value} {spread}" + (
            f" (finite in {self.n_valid}/{self.n_total})" if self.n_valid < self.n_total else ""
        )


def interval(value: float, samples, level: float = 0.9) -> Interval:
    """Percentile interval; an infinite replicate (Diff never reaches the loss) counts as +inf, so a bound can be
    inf."""
    s = np.asarray([v for v in samples if not np.isnan(v)], dtype=float)
    finite = int(np.isfinite(s).sum())
    if not finite:
        return Interval(value, float("nan"), float("nan"), 0, len(s))
    q = (1 - level) / 2
    low, high = (float(np.quantile(s, p, method="nearest")) for p in (q, 1 - q))
    return Interval(value, low, high, finite, len(s))


POWER_LAW_PARAMS, JOINT_PARAMS = 3, 5  # E, A, alpha; E, A, alpha, B, beta
JOINT_KEYS = ("E", "A", "alpha", "B", "beta")
# The least a fit must have to be made at all: one point more than its parameters (a residual to speak of), and
# L(N) three sizes (E + A N^-alpha through two sizes has a free parameter: any alpha fits)
MIN_POINTS = {"L(N)": POWER_LAW_PARAMS + 1, "L(N, D)": JOINT_PARAMS + 1}
MIN_SIZES = 3
JOINT_EXPONENTS = (0.02, 2.0)  # fit_joint's starting grid: an exponent at (or past) its ends is at the search bound


def check_identified(kind: str, n_points: int, n_sizes: int) -> None:
    """A one-line refusal for a fit with fewer points (or sizes) than MIN_POINTS (MIN_SIZES) ask."""
    if n_points < MIN_POINTS[kind] or n_sizes < MIN_SIZES:
        raise UserError(
            f"refused: {n_points} points at {n_sizes} sizes; {kind} needs >= {MIN_POINTS[kind]} points at >= "
            f"{MIN_SIZES} sizes to be identified"
        )


def at_bounds(law) -> tuple[str, ...]:
    """The parameters of a fit that sit at a bound of their search (flags, not estimates): E or A or B at 0 (the
    non-negativity constraint), an exponent at the end of its grid."""
    lo, hi = (ALPHAS[0], ALPHAS[-1]) if isinstance(law, PowerLaw) else JOINT_EXPONENTS
    flags = [f"{k}=0" for k in ("E", "A", "B") if hasattr(law, k) and getattr(law, k) <= 0]
    flags += [f"{k} at grid end" for k in ("alpha", "beta") if hasattr(law, k) and not lo < getattr(law, k) < hi]
    return tuple(flags)


SPAN_LIMIT = 10.0  # an exponent whose interval's high / low exceeds this (an order of magnitude) is not identified


def not_identified(law, intervals: dict) -> list[str]:
    """Why a fit cannot carry a gap: its parameters at a bound (at_bounds) and its exponents (alpha, beta) whose
    bootstrap interval spans more than SPAN_LIMIT x (intervals: name -> Interval); empty when identified."""
    why = list(at_bounds(law))
    for k in ("alpha", "beta"):
        iv = intervals.get(k)
        if iv is not None and not iv.exact and iv.n_valid and iv.low > 0 and iv.high / iv.low > SPAN_LIMIT:
            why.append(f"{k} [{iv.low:.3g}, {iv.high:.3g}] spans {iv.high / iv.low:.0f}x")
        elif iv is not None and not iv.exact and iv.n_valid and iv.low <= 0:
            why.append(f"{k} [{iv.low:.3g}, {iv.high:.3g}] reaches 0")
    return why


def exactly_determined(n_points: int, n_params: int) -> bool:
    """No more points than parameters: the fit passes through every point, its residuals are zero, and a residual
    bootstrap returns the same fit every time (zero-width intervals that need not even contain the estimate)."""
    return n_points <= n_params


def no_interval(value: float) -> Interval:
    return Interval(value, float("nan"), float("nan"), 0, 0, exact=True)


def bootstrap_power_law(
    x, loss, reps: int = 500, seed: int | np.random.Generator = 0, seeds=None
) -> tuple[PowerLaw, list[PowerLaw]]:
    """With `seeds` (each point's run seed) and a size holding >= 2 runs: replicates refit on the runs redrawn size by
    size (diffllm/scaling/resample.py). Otherwise a residual bootstrap: refit on fitted values plus residuals drawn
    with replacement (one run per size: nothing to redraw)."""
    x, y = np.asarray(x, dtype=float), np.asarray(loss, dtype=float)
    best = fit_power_law(x, y)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    groups = strata(x, seeds) if seeds is not None else []
    if resamplable(groups):
        idx = [take(groups, uniforms(rng, [groups])) for _ in range(reps)]
        return best, [fit_power_law(x[i], y[i]) for i in idx]
    resid = y - best(x)
    return best, [fit_power_law(x, best(x) + rng.choice(resid, len(resid))) for _ in range(reps)]


def paired_power_laws(a: tuple, b: tuple, reps: int, rng: np.random.Generator) -> tuple[list, list]:
    """Replicates of two series' L(N) from the same draws (a, b: (x, loss, seeds)), paired by seed position; None
    when neither has a size with >= 2 runs (no run bootstrap: the caller pairs residual replicates)."""
    ga, gb = strata(a[0], a[2]), strata(b[0], b[2])
    if not (resamplable(ga) or resamplable(gb)):
        return None
    xa, ya, xb, yb = (np.asarray(v, dtype=float) for v in (a[0], a[1], b[0], b[1]))
    out_a, out_b = [], []
    for _ in range(reps):
        u = uniforms(rng, [ga, gb])
        ia, ib = take(ga, u), take(gb, u)
        out_a.append(fit_power_law(xa[ia], ya[ia]))
        out_b.append(fit_power_law(xb[ib], yb[ib]))
    return out_a, out_b


def paired_joint(a: tuple, b: tuple, reps: int, rng: np.random.Generator) -> Optional[tuple[list, list]]:
    """Replicates of two series' L(N, D) from one draw of seeds per replicate (a, b: (n, d, loss, seeds) per point).
    A run family is a (size, seed): a seed's runs at one size (its budgets, its learning-curve points) share a stable
    run and a data order, so they are redrawn together. At the j-th size of each series (sizes increasing) the seed
    positions floor(u * m) of its m seed-sorted families are drawn once and taken by both series: with the same seeds,
    both sides of a replicate hold the same seeds. None when no size has >= 2 seeds (nothing to redraw)."""
    fam = [_families(x[0], x[3]) for x in (a, b)]
    if not any(len(f) > 1 for fs in fam for f in fs):
        return None
    out: tuple[list, list] = ([], [])
    for _ in range(reps):
        u = rng.random((max(len(f) for f in fam), max(len(s) for f in fam for s in f)))
        for (n, d, y, _), fs, got in zip((a, b), fam, out):
            i = np.concatenate([s[int(u[j, k] * len(s))] for j, s in enumerate(fs) for k in range(len(s))])
            got.append(fit_joint(np.asarray(n, float)[i], np.asarray(d, float)[i], np.asarray(y, float)[i]))
    return out


def _families(n, seeds) -> list[list[np.ndarray]]:
    """Per size (increasing), the point indices of each seed (seeds sorted)."""
    n, seeds = np.asarray(n, dtype=float), np.asarray([-1 if s is None else s for s in seeds])
    return [[np.flatnonzero((n == v) & (seeds == s)) for s in np.unique(seeds[n == v])] for v in np.unique(n)]


def bootstrap_joint(
    n, d, loss, reps: int = 200, seed: int | np.random.Generator = 0
) -> tuple[JointLaw, list[JointLaw]]:
    """Residual bootstrap (learning-curve points are not independent runs to redraw)."""
    n, d, y = (np.asarray(v, dtype=float) for v in (n, d, loss))
    best = fit_joint(n, d, y)
    resid = y - best(n, d)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return best, [fit_joint(n, d, best(n, d) + rng.choice(resid, len(resid))) for _ in range(reps)]


def ratio_at_equal_loss(reference: PowerLaw, other: PowerLaw, x_ref: float) -> float:
    """x_other / x_ref such that other(x_other) = reference(x_ref): e.g. Diff parameters / Transformer parameters
    needed for the Transformer's loss at x_ref (the paper's 62.2%)."""
    return other.inverse(float(reference(x_ref))) / x_ref


def ratio_interval(ref_fit, ref_boot, other_fit, other_boot, x_ref: float, level: float = 0.9) -> Interval:
    """The ratio from the best fits, with an interval from pairing the two arches' bootstrap replicates."""
    samples = [ratio_at_equal_loss(r, o, x_ref) for r, o in zip(ref_boot, other_boot)]
    return interval(ratio_at_equal_loss(ref_fit, other_fit, x_ref), samples, level)
