"""Statistics for study reports: exponential fits of loss vs heads, seed spread, and tests.

- Fit form: ``loss = a + b * exp(-c * heads)`` (the blog's "exponential fit"), by least squares
  with :func:`scipy.optimize.curve_fit`, started from a grid search over ``c`` (for a fixed ``c``
  the model is linear in ``a`` and ``b``) so that it does not depend on a lucky initial guess.
- Seeds: mean, sample standard deviation (ddof = 1) and count per variant.
- Significance: Welch's unequal-variance t-test (:func:`scipy.stats.ttest_ind` with
  ``equal_var=False``) of a variant's seeds against its baseline's, with Holm's step-down
  correction over all comparisons of a report. Needs at least two seeds on each side.
- The fitted difference between two series at a total, with a bootstrap interval over seeds
  (resampling each point's seeds with replacement and refitting).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats as sps
from scipy.optimize import OptimizeWarning, curve_fit

EXP_FORM = "loss = a + b * exp(-c * heads)"


def _exp(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return a + b * np.exp(-c * x)


@dataclass
class ExpFit:
    """A fitted ``a + b * exp(-c * x)``."""

    a: float
    b: float
    c: float
    n_points: int
    rmse: float
    #: set when the data do not pin the curve down (e.g. c at the edge of its search range)
    note: str = ""
    form: str = EXP_FORM

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return _exp(np.asarray(x, dtype=float), self.a, self.b, self.c)


def fit_exponential(x: Sequence[float], y: Sequence[float]) -> ExpFit | None:
    """Least-squares fit of ``y = a + b exp(-c x)`` with ``c >= 0``; None with fewer than three
    distinct ``x`` (three parameters need three points)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(np.unique(x)) < 3:
        return None
    scale = float(np.max(np.abs(x)))
    # Grid over c (in units of 1/max x): for each c, a and b follow by linear least squares
    # (simple regression of y on u = exp(-c x)), all c at once.
    grid = np.logspace(-3, 2, 400) / scale
    u = np.exp(-np.outer(grid, x))
    u_mean = u.mean(axis=1, keepdims=True)
    du, dy = u - u_mean, y - y.mean()
    var_u = np.sum(du**2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        b_all = np.where(var_u > 0, du @ dy / var_u, 0.0)
    a_all = y.mean() - b_all * u_mean[:, 0]
    sse_all = np.sum((a_all[:, None] + b_all[:, None] * u - y) ** 2, axis=1)
    k = int(np.nanargmin(sse_all))
    best = (float(sse_all[k]), float(a_all[k]), float(b_all[k]), float(grid[k]))
    _, a0, b0, c0 = best
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            (a, b, c), _ = curve_fit(_exp, x, y, p0=[a0, b0, c0], bounds=([-np.inf, -np.inf, 0.0], np.inf),
                                     maxfev=20000)
        except (RuntimeError, ValueError):
            a, b, c = a0, b0, c0
    # keep the grid's answer if the refinement wandered off to something worse
    if np.sum((_exp(x, a, b, c) - y) ** 2) > best[0]:
        a, b, c = a0, b0, c0
    rmse = float(np.sqrt(np.mean((_exp(x, a, b, c) - y) ** 2)))
    note = ""
    if c <= grid[0] * 1.0001:
        note = ("c -> 0: the best fit is the straight-line limit (the points do not follow a decaying "
                "exponential), so a and b are not meaningful on their own")
    elif c >= grid[-1] * 0.9999:
        note = "c at the upper edge of its range: the fit is flat beyond the smallest total"
    return ExpFit(float(a), float(b), float(c), int(len(x)), rmse, note)


def percent_difference(value: float, reference: float) -> float:
    """``100 * (value - reference) / reference``: negative means lower (better) loss."""
    return 100.0 * (value - reference) / reference


@dataclass
class SeedStats:
    """Mean, sample standard deviation and count of one variant's final losses."""

    values: list[float]
    mean: float = field(init=False)
    std: float = field(init=False)
    n: int = field(init=False)

    def __post_init__(self) -> None:
        v = np.asarray([x for x in self.values if x is not None and math.isfinite(x)], dtype=float)
        self.n = int(v.size)
        self.mean = float(v.mean()) if v.size else math.nan
        self.std = float(v.std(ddof=1)) if v.size > 1 else math.nan


def seed_stats(values: Sequence[float | None]) -> SeedStats:
    """:class:`SeedStats` of the finite values."""
    return SeedStats([float(v) for v in values if v is not None])


@dataclass
class Comparison:
    """A variant against its baseline across seeds."""

    name: str
    baseline: str
    n: int
    n_baseline: int
    difference: float
    percent: float
    t: float
    p: float
    p_holm: float = math.nan

    @property
    def testable(self) -> bool:
        return math.isfinite(self.p)


def welch_test(values: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """Welch's t statistic and two-sided p-value; NaN when either side has fewer than two
    values or both have no spread."""
    a = np.asarray(values, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if a.size < 2 or b.size < 2 or (np.var(a) == 0 and np.var(b) == 0):
        return math.nan, math.nan
    res = sps.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def compare(name: str, values: Sequence[float], baseline_name: str, baseline: Sequence[float]) -> Comparison:
    """Mean difference, % difference and Welch's test of ``values`` against ``baseline``."""
    a, b = seed_stats(values), seed_stats(baseline)
    t, p = welch_test(a.values, b.values)
    return Comparison(name, baseline_name, a.n, b.n, a.mean - b.mean, percent_difference(a.mean, b.mean), t, p)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaNs pass through and do not count as tests)."""
    idx = [i for i, p in enumerate(pvalues) if math.isfinite(p)]
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def apply_holm(comparisons: list[Comparison]) -> None:
    """Fill ``p_holm`` of each comparison, correcting over all of them."""
    for c, p in zip(comparisons, holm([c.p for c in comparisons])):
        c.p_holm = p


def bootstrap_fit_difference(
    series: dict[str, list[tuple[float, list[float]]]],
    baseline: str,
    at: float,
    draws: int = 400,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of each series' fitted % difference from ``baseline`` at ``at``
    heads, resampling every point's seed losses with replacement and refitting both curves.

    ``series`` maps a name to ``[(total_heads, [loss per seed]), ...]``. Series whose points
    have fewer than two seeds, or whose fits fail, are left out."""
    rng = np.random.default_rng(seed)
    if baseline not in series or any(len(v) < 2 for _, v in series[baseline]):
        return {}
    out: dict[str, tuple[float, float]] = {}
    for name, points in series.items():
        if name == baseline or any(len(v) < 2 for _, v in points):
            continue
        diffs = []
        for _ in range(draws):
            fits = []
            for pts in (points, series[baseline]):
                xs = [x for x, _ in pts]
                ys = [float(np.mean(rng.choice(v, size=len(v), replace=True))) for _, v in pts]
                fits.append(fit_exponential(xs, ys))
            if fits[0] is None or fits[1] is None:
                break
            diffs.append(percent_difference(float(fits[0](at)), float(fits[1](at))))
        if len(diffs) == draws:
            lo, hi = np.percentile(diffs, [2.5, 97.5])
            out[name] = (float(lo), float(hi))
    return out
