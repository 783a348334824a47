"""Paired comparisons of a variant with its baseline, seed by seed, and the verdict on a claim.

Seed ``s`` fixes the data order (and any sampled data) of every variant, so variant and baseline
runs of one seed see the same batches: their difference removes the data's share of the seed
noise. Everything here is on the *gain*, the paired difference oriented so that a positive
value favours the variant (``variant - baseline`` for a metric where higher is better,
``baseline - variant`` for a loss or an error).

- Interval: the two-sided 95% t interval of the mean gain (``n - 1`` degrees of freedom).
- Tests are one-sided at :data:`ALPHA` = 2.5%, the level at which that interval excludes a bound:
  "better" claims test ``gain <= 0``; "as good" (non-inferiority) claims test ``gain <= -margin``.
  Holm's step-down correction runs over the comparisons of one claim (its family).
- Effect size: Cohen's ``d_z``, the mean gain over the standard deviation of the gains.
- The smallest gain ``n`` seeds detect: the true gain at which the one-sided test rejects with
  80% power, given the observed spread (from the noncentral t distribution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

from headwise.report.stats import holm

#: One-sided level of every test: a 95% two-sided interval excludes the bound exactly when p < ALPHA
ALPHA = 0.025
CONFIDENCE = 0.95
POWER = 0.8
INTERVAL_METHOD = "95% t interval of the paired differences"


class Verdict(str, Enum):
    """What a claim's comparison shows."""

    REPRODUCED = "reproduced"
    CONTRADICTED = "contradicted"
    NOT_SHOWN = "not shown at this scale"
    EQUIVALENT = "equivalent within the margin"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PairedGain:
    """A variant's gains over its baseline, one per seed both completed, and their summary."""

    seeds: tuple[int, ...]
    gains: tuple[float, ...]
    mean: float
    sd: float
    low: float
    high: float
    #: Cohen's d_z: mean / sd (NaN with fewer than two seeds or no spread)
    effect_size: float
    #: the smallest true gain these seeds detect with 80% power (NaN with fewer than two seeds)
    detectable: float

    @property
    def n(self) -> int:
        return len(self.gains)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


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


def detectable_gain(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true mean gain that a one-sided paired t test at ``alpha`` over ``n`` seeds detects
    with probability ``power``, when the gains' standard deviation is ``sd``."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    df, crit = n - 1, sps.t.ppf(1 - alpha, n - 1)

    def shortfall(effect: float) -> float:  # power at a standardised effect, minus the target
        return float(sps.nct.sf(crit, df, effect * math.sqrt(n))) - power

    effect = optimize.brentq(shortfall, 0.0, 100.0)
    return effect * sd


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
    """One comparison of a claim: its gain, the test's p-values (raw and Holm-adjusted within
    the claim) and the verdict."""

    gain: PairedGain
    p: float
    p_holm: float
    verdict: Verdict
    note: str = ""


def judge(gains: Sequence[PairedGain], *, margin: float | None = None, paper_gain: float | None = None) -> list[Judged]:
    """The verdict on each comparison of one claim (Holm-corrected together).

    Without ``margin`` the claim is that the variant is better: *reproduced* when ``gain <= 0``
    is rejected, *contradicted* when ``gain >= 0`` is, else *not shown at this scale*. With a
    ``margin`` (> 0, in the metric's units) the claim is that the variant is as good:
    *equivalent within the margin* when ``gain <= -margin`` is rejected (the interval stays above
    ``-margin``), *contradicted* when ``gain >= -margin`` is, else *not shown at this scale*.
    ``paper_gain`` (the published effect as a gain) qualifies a *not shown* verdict: whether the
    interval still covers it."""
    bound = 0.0 if margin is None else -margin
    p_for = [one_sided_p(g.gains, bound) for g in gains]
    p_against = [one_sided_p([-x for x in g.gains], -bound) for g in gains]
    holm_for, holm_against = holm(p_for), holm(p_against)
    out = []
    for g, p, pf, pa in zip(gains, p_for, holm_for, holm_against):
        if g.n < 2:
            out.append(Judged(g, p, pf, Verdict.NOT_SHOWN, f"{g.n} paired seed{'s' if g.n != 1 else ''}: no interval"))
            continue
        if pf < ALPHA:
            verdict = Verdict.REPRODUCED if margin is None else Verdict.EQUIVALENT
        elif pa < ALPHA:
            verdict = Verdict.CONTRADICTED
        else:
            verdict = Verdict.NOT_SHOWN
        note = ""
        if verdict is Verdict.NOT_SHOWN and paper_gain is not None:
            covered = g.low <= paper_gain <= g.high
            note = ("the interval covers both the paper's effect and the null" if covered
                    else "the interval excludes the paper's effect: smaller here, if present")
        out.append(Judged(g, p, pf, verdict, note))
    return out


def seeds_for(half_width: float, sd: float, n_max: int = 1000) -> int | None:
    """The fewest seeds whose 95% t interval has a half-width at most ``half_width`` when the
    gains' standard deviation is ``sd`` (None beyond ``n_max``)."""
    if not (math.isfinite(sd) and half_width > 0):
        return None
    for n in range(2, n_max + 1):
        if sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return None
