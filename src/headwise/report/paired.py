"""Paired comparisons of a variant with its baseline, seed by seed, and the verdict on a claim.

Seed ``s`` fixes the data order (and any sampled data) of every variant, so variant and baseline
runs of one seed see the same batches: their difference removes the data's share of the seed
noise. Everything here is on the *gain*, the paired difference oriented so that a positive
value favours the variant (``variant - baseline`` for a metric where higher is better,
``baseline - variant`` for a loss or an error).

- The claim's test (``Claim.test``) and its bound:

  - ``"better"``: superiority, one-sided test of ``gain <= 0``;
  - ``"as_good"``: non-inferiority, one-sided test of ``gain <= -margin``;
  - ``"equivalent"``: two one-sided tests (TOST) of ``gain <= -margin`` and ``gain >= +margin``.

- Multiplicity: each claim is one family, tested at one-sided :data:`ALPHA` = 2.5% in all,
  split by Bonferroni over its ``m`` comparisons. Each comparison's interval is the two-sided
  t interval at confidence ``1 - 2 ALPHA / m`` (95% for ``m = 1``, ``n - 1`` degrees of freedom),
  and the verdict is read off that interval: it excludes a bound exactly when the one-sided p
  times ``m`` is below ALPHA. The printed p is that Bonferroni-adjusted one, ``min(1, m p)``.
- Effect size: Cohen's ``d_z``, the mean gain over the standard deviation of the gains.
- Power: from the noncentral t distribution (one-sided tests) and, for TOST, an exact
  one-dimensional integral over the sample standard deviation (Owen 1965), at the observed sd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Literal, Mapping, Sequence

import numpy as np
from scipy import integrate, optimize
from scipy import stats as sps

#: One-sided level of each claim (its family), split by Bonferroni over the claim's comparisons
ALPHA = 0.025
#: The unadjusted two-sided level: that of a claim with one comparison
CONFIDENCE = 0.95
POWER = 0.8
#: The words of a study file's ``test``
TESTS = ("better", "as_good", "equivalent")
Test = Literal["better", "as_good", "equivalent"]
INTERVAL_METHOD = ("two-sided t interval of the paired differences at confidence 1 - 5%/m, m the number of "
                   "the claim's comparisons (Bonferroni; 95% for one)")


class Verdict(StrEnum):
    """What a claim's comparison shows, named after the test that decided it."""

    #: "better": the interval lies above 0
    SUPERIOR = "superior"
    #: "better": the interval lies below 0; "as_good": it lies wholly below -margin
    INFERIOR = "inferior"
    #: "as_good": the interval lies above -margin
    NON_INFERIOR = "non-inferior within the margin"
    #: "equivalent": the interval lies within (-margin, +margin)
    EQUIVALENT = "equivalent"
    #: "equivalent": the interval lies wholly above +margin or wholly below -margin
    NOT_EQUIVALENT = "not equivalent"
    #: any test: the interval reaches the bound
    NOT_SHOWN = "not shown at this scale"


#: the verdicts that support the claim, and those that go against it (the figure's green and red)
SUPPORTS = frozenset({Verdict.SUPERIOR, Verdict.NON_INFERIOR, Verdict.EQUIVALENT})
AGAINST = frozenset({Verdict.INFERIOR, Verdict.NOT_EQUIVALENT})


@dataclass(frozen=True)
class PairedGain:
    """A variant's gains over its baseline, one per seed both completed, and their unadjusted
    summary (the 95% t interval, as for a claim with one comparison)."""

    seeds: tuple[int, ...]
    gains: tuple[float, ...]
    mean: float
    sd: float
    #: the unadjusted two-sided 95% t interval
    low: float
    high: float
    #: Cohen's d_z: mean / sd (NaN with fewer than two seeds or no spread)
    effect_size: float
    #: the smallest true distance above a bound these seeds detect with 80% power at one-sided
    #: 2.5% (unadjusted; NaN with fewer than two seeds)
    detectable: float

    @property
    def n(self) -> int:
        return len(self.gains)


def pair_by_seed(variant: Mapping[int, float], baseline: Mapping[int, float]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """The seeds both sides have, in increasing order, with each side's values at those seeds."""
    seeds = tuple(sorted(set(variant) & set(baseline)))
    return seeds, np.array([variant[s] for s in seeds], float), np.array([baseline[s] for s in seeds], float)


def t_interval(gains: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided t interval of the mean of ``gains`` (NaNs with fewer than two)."""
    g = np.asarray(gains, float)
    if g.size < 2:
        return math.nan, math.nan
    half = sps.t.ppf(0.5 + confidence / 2, g.size - 1) * g.std(ddof=1) / math.sqrt(g.size)
    return float(g.mean() - half), float(g.mean() + half)


def bonferroni_confidence(m: int) -> float:
    """The two-sided confidence of each of a claim's ``m`` intervals: ``1 - 2 ALPHA / m``, so
    that each one-sided bound is at ``ALPHA / m`` and the claim at ALPHA in all."""
    if m < 1:
        raise ValueError(f"a claim has at least one comparison, not {m}")
    return 1 - 2 * ALPHA / m


def one_sided_p(gains: Sequence[float], bound: float = 0.0) -> float:
    """p-value of the one-sided t test of ``mean gain <= bound`` against ``mean gain > bound``
    (NaN with fewer than two gains; 0 or 1 when they have no spread)."""
    g = np.asarray(gains, float)
    if g.size < 2:
        return math.nan
    sd = g.std(ddof=1)
    if sd == 0:
        return 0.0 if g.mean() > bound else 1.0
    t = (g.mean() - bound) / (sd / math.sqrt(g.size))
    return float(sps.t.sf(t, g.size - 1))


def claim_p(gains: Sequence[float], test: Test, margin: float | None = None) -> float:
    """The unadjusted p-value of the claim's test: one-sided against 0 ("better") or against
    ``-margin`` ("as_good"); for "equivalent" (TOST) the larger of the two one-sided p-values,
    of ``gain <= -margin`` and of ``gain >= +margin``."""
    if test == "better":
        return one_sided_p(gains, 0.0)
    if margin is None:
        raise ValueError(f"an {test} test needs a margin")
    lower = one_sided_p(gains, -margin)
    if test == "as_good":
        return lower
    upper = one_sided_p([-g for g in gains], -margin)   # gain >= +margin, mirrored
    return max(lower, upper)


def decide(low: float, high: float, test: Test, margin: float | None = None) -> tuple[Verdict, str]:
    """The verdict read off an interval (already at the claim's adjusted level), and the note
    that qualifies it ("" when none). A bound the interval touches is not excluded."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return Verdict.NOT_SHOWN, ""
    if test == "better":
        if low > 0:
            return Verdict.SUPERIOR, ""
        return (Verdict.INFERIOR, "") if high < 0 else (Verdict.NOT_SHOWN, "")
    if margin is None or not margin > 0:
        raise ValueError(f"an {test} test needs a positive margin, not {margin}")
    if test == "as_good":
        if low > -margin:
            also = (["also superior: the interval excludes 0"] if low > 0 else []) + \
                   (["also equivalent (TOST)"] if high < margin else [])
            return Verdict.NON_INFERIOR, "; ".join(also)
        if high < -margin:
            return Verdict.INFERIOR, "worse than the margin"
        return Verdict.NOT_SHOWN, "the interval lies below 0" if high < 0 else ""
    if test == "equivalent":
        if -margin < low and high < margin:
            return Verdict.EQUIVALENT, ""
        if low > margin:
            return Verdict.NOT_EQUIVALENT, "different: superior beyond the margin"
        if high < -margin:
            return Verdict.NOT_EQUIVALENT, "different: inferior beyond the margin"
        return Verdict.NOT_SHOWN, ""
    raise ValueError(f"unknown test {test!r}: one of {', '.join(TESTS)}")


def verdict_of(gains: Sequence[float], test: Test, margin: float | None, m: int) -> Verdict:
    """The verdict on one comparison's ``gains`` at a claim's Bonferroni level (``m``
    comparisons): what :func:`judge` decides, without the summary."""
    if len(gains) < 2:
        return Verdict.NOT_SHOWN
    return decide(*t_interval(gains, bonferroni_confidence(m)), test, margin)[0]


def detectable_gain(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true distance above a bound at which a one-sided paired t test at ``alpha`` over ``n``
    seeds rejects with probability ``power``, when the gains' standard deviation is ``sd``."""
    if n < 2 or not math.isfinite(sd) or not 0 < power < 1:  # a power of 1 needs an infinite gain
        return math.nan
    if sd == 0:
        return 0.0
    df, crit = n - 1, sps.t.ppf(1 - alpha, n - 1)

    def shortfall(effect: float) -> float:  # power at a standardised effect, minus the target
        return _nct_sf(crit, df, effect * math.sqrt(n)) - power

    # few seeds at a small alpha need a large effect (past 100 at 2 seeds and ALPHA / 9): double
    # the bracket until it holds the answer
    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    return optimize.brentq(shortfall, 0.0, high) * sd


def paired_gain(variant: Mapping[int, float], baseline: Mapping[int, float], higher_is_better: bool) -> PairedGain:
    """The variant's gain over its baseline at the seeds both have (keyed by seed)."""
    seeds, v, b = pair_by_seed(variant, baseline)
    gains = (v - b) if higher_is_better else (b - v)
    n = gains.size
    mean = float(gains.mean()) if n else math.nan
    sd = float(gains.std(ddof=1)) if n > 1 else math.nan
    low, high = t_interval(gains)
    effect = mean / sd if n > 1 and sd > 0 else math.nan
    return PairedGain(seeds, tuple(float(g) for g in gains), mean, sd, low, high, effect, detectable_gain(n, sd))


@dataclass(frozen=True)
class Judged:
    """One comparison of a claim: its gain, the interval at the claim's Bonferroni level, the
    test's p-values (unadjusted and x m) and the verdict."""

    gain: PairedGain
    test: Test
    #: the claim's number of comparisons, over which Bonferroni splits ALPHA
    m: int
    #: the two-sided confidence of ``low`` and ``high``: 1 - 2 ALPHA / m
    confidence: float
    low: float
    high: float
    #: the unadjusted p of the test (TOST: the larger one-sided p)
    p: float
    #: Bonferroni: min(1, m p); below ALPHA exactly when the interval excludes the bound
    p_adjusted: float
    verdict: Verdict
    #: this comparison's margin in the metric's units (None for "better")
    margin: float | None = None
    #: the paper's effect as a gain for this comparison (None when the claim gives none)
    paper_gain: float | None = None
    #: the smallest true distance above the bound these seeds detect with 80% power at ALPHA / m
    detectable: float = math.nan
    note: str = ""


def _paper_note(low: float, high: float, paper: float) -> str:
    """Where a *not shown* interval lies against the paper's effect."""
    if low <= paper <= high:
        return "the interval covers the paper's effect"
    if paper > high:
        return "the interval lies below the paper's effect: smaller here, if present"
    return "the interval lies above the paper's effect: larger here"


def judge(gains: Sequence[PairedGain], test: Test = "better", *, margins: Sequence[float | None] | None = None,
          paper_gains: Sequence[float | None] | None = None, m: int | None = None) -> list[Judged]:
    """The verdict on each comparison of one claim, Bonferroni-corrected over ``m`` comparisons
    (by default ``len(gains)``; a claim passes its declared number of pairs).

    ``margins`` (one per comparison, > 0, in the metric's units; each from its own baseline) are
    required by "as_good" and "equivalent" and refused by "better"; ``paper_gains`` (one per
    comparison, the published effect as a gain) qualify a *not shown* verdict. The interval is
    the t interval at ``1 - 2 ALPHA / m``; :func:`decide` reads the verdict off it."""
    k = len(gains)
    m = k if m is None else m
    if m < k:
        raise ValueError(f"{k} comparisons cannot be corrected as {m}")
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}: one of {', '.join(TESTS)}")
    margins = list(margins) if margins is not None else [None] * k
    papers = list(paper_gains) if paper_gains is not None else [None] * k
    if len(margins) != k or len(papers) != k:
        raise ValueError(f"one margin and one paper gain per comparison: {k} comparisons, "
                         f"{len(margins)} margins, {len(papers)} paper gains")
    if test == "better" and any(x is not None for x in margins):
        raise ValueError("a better claim has no margin")
    confidence = bonferroni_confidence(m) if m else CONFIDENCE
    out = []
    for g, margin, paper in zip(gains, margins, papers):
        if test != "better" and not (margin is not None and margin > 0 and math.isfinite(margin)):
            raise ValueError(f"an {test} claim needs a positive margin for every comparison, not {margin}")
        if g.n < 2:
            out.append(Judged(g, test, m, confidence, math.nan, math.nan, math.nan, math.nan, Verdict.NOT_SHOWN,
                              margin, paper, math.nan, f"{g.n} paired seed{'s' if g.n != 1 else ''}: no interval"))
            continue
        low, high = t_interval(g.gains, confidence)
        p = claim_p(g.gains, test, margin)
        verdict, note = decide(low, high, test, margin)
        if verdict is Verdict.NOT_SHOWN and paper is not None:
            note = "; ".join(x for x in (note, _paper_note(low, high, paper)) if x)
        out.append(Judged(g, test, m, confidence, low, high, p, min(1.0, m * p), verdict, margin, paper,
                          detectable_gain(g.n, g.sd, ALPHA / m), note))
    return out


def _nct_sf(x: float, df: int, nc: float) -> float:
    """P(T > x) for T noncentral t with ``df`` degrees of freedom and noncentrality ``nc``.

    scipy's ``nct.sf`` is NaN once ``|nc|`` passes about 3e9 (an effect dwarfing the spread);
    there take the same probability as E[Phi(nc - x u / sqrt(df))], u ~ chi(df), which stays
    finite (T = (Z + nc) sqrt(df) / u with Z ~ N(0, 1))."""
    p = float(sps.nct.sf(x, df, nc))
    if math.isnan(p):
        p = _over_chi(lambda u: float(sps.norm.cdf(nc - x * u / math.sqrt(df))), df)
    return p


def _over_chi(f: Callable[[float], float], df: int, upper: float = math.inf) -> float:
    """The mean of the probability ``f(u)`` over u ~ chi(df) restricted to ``u < upper`` (f taken
    as 0 above it), within [0, 1] (the pieces' rounding may carry their sum past 1).

    One quadrature over (0, upper) misses the density's bulk when it is a narrow spike (large df)
    or a speck in a wide range (a large upper): integrate piece by piece between quantiles of u
    (the centre, the 1e-6 tails, and the 1e-20 upper tail beyond which nothing counts)."""
    edges = [0.0, *sps.chi.ppf([1e-6, 0.5], df), *sps.chi.isf([1e-6, 1e-20], df)]
    edges = [e for e in edges[:-1] if e < upper] + [min(upper, edges[-1])]

    def weighted(u: float) -> float:
        return f(u) * float(sps.chi.pdf(u, df))

    total = sum(integrate.quad(weighted, a, b, limit=200, epsabs=1e-14)[0] for a, b in zip(edges, edges[1:]))
    return min(1.0, max(0.0, total))


def _tost_power(n: int, sd: float, true_gain: float, margin: float, alpha: float) -> float:
    """P(both one-sided tests at ``alpha`` reject), exactly: the sample mean and sd are independent,
    so average the normal probability that the mean lies in (-margin + c s / sqrt n,
    margin - c s / sqrt n) over the distribution of s = sd u / sqrt(n - 1), u ~ chi(n - 1)."""
    df, se = n - 1, sd / math.sqrt(n)
    c = sps.t.ppf(1 - alpha, df)
    u_max = math.sqrt(df) * margin / (c * se)     # beyond it the acceptance region is empty

    def inside(u: float) -> float:
        h = c * se * u / math.sqrt(df)            # c s / sqrt(n)
        return float(sps.norm.cdf((margin - h - true_gain) / se) - sps.norm.cdf((-margin + h - true_gain) / se))

    return _over_chi(inside, df, u_max)


def power(n: int, sd: float, test: Test, *, true_gain: float, margin: float | None = None,
          alpha: float = ALPHA) -> float:
    """The probability that the claim's test at one-sided ``alpha`` (each side, for TOST) shows
    the claim over ``n`` paired seeds when the gains are normal with mean ``true_gain`` and
    standard deviation ``sd``: noncentral t for "better" (bound 0) and "as_good" (bound -margin),
    the exact integral of :func:`_tost_power` for "equivalent"."""
    if n < 2 or not (math.isfinite(sd) and sd >= 0):
        return math.nan
    if test == "equivalent":
        if margin is None:
            raise ValueError("an equivalent test needs a margin")
        if sd == 0:
            return 1.0 if abs(true_gain) < margin else 0.0
        return _tost_power(n, sd, true_gain, margin, alpha)
    bound = 0.0 if test == "better" else -(margin if margin is not None else math.nan)
    if not math.isfinite(bound):
        raise ValueError("an as_good test needs a margin")
    if sd == 0:
        return 1.0 if true_gain > bound else 0.0
    crit = sps.t.ppf(1 - alpha, n - 1)
    return _nct_sf(crit, n - 1, (true_gain - bound) * math.sqrt(n) / sd)


def seeds_for_power(sd: float, test: Test, *, true_gain: float, margin: float | None = None,
                    alpha: float = ALPHA, target: float = POWER, n_max: int = 1000) -> int | None:
    """The fewest paired seeds (at least 2) whose test has at least ``target`` power (see
    :func:`power`); None when more than ``n_max`` would be needed or the power never gets there
    (a true gain on the wrong side of the bound)."""
    if not (math.isfinite(sd) and sd >= 0):
        return None
    hopeless = ((test == "better" and true_gain <= 0)
                or (test == "as_good" and margin is not None and true_gain <= -margin)
                or (test == "equivalent" and margin is not None and abs(true_gain) >= margin))
    if hopeless:
        return None

    def enough(n: int) -> bool:
        return power(n, sd, test, true_gain=true_gain, margin=margin, alpha=alpha) >= target

    if enough(2):
        return 2
    # power rises with n: double to bracket the answer, then bisect (few TOST integrals)
    lo, hi = 2, 4
    while not enough(hi):
        if hi >= n_max:
            return None
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi
