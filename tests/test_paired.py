"""Paired comparisons and verdicts (headwise.report.paired) against values worked by hand, closed
forms and seeded simulations."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats as sps

from headwise.report.paired import (
    ALPHA, Verdict, bonferroni_confidence, claim_p, decide, detectable_gain, judge, one_sided_p, paired_gain, power,
    seeds_for_power, t_interval, verdict_of,
)

ZERO = {s: 0.0 for s in range(5)}


def t4_tail(t: float) -> float:
    """P(T > t) for Student's t with 4 degrees of freedom, in closed form:
    1/2 - (3/8) x (1 - t^2 / (12 s)) with s = 1 + t^2 / 4 and x = t / sqrt(s)."""
    s = 1 + t * t / 4
    return 0.5 - 0.375 * (t / math.sqrt(s)) * (1 - t * t / (12 * s))


def t4_quantile(p: float) -> float:
    """The p quantile (p > 1/2) of Student's t with 4 degrees of freedom, in closed form:
    2 sqrt(q - 1) with q = cos(arccos(sqrt(a)) / 3) / sqrt(a) and a = 4 p (1 - p)."""
    a = 4 * p * (1 - p)
    return 2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)


def gains_of(values) -> object:
    """A PairedGain whose gains are ``values`` (against a baseline of zeros, higher is better)."""
    return paired_gain({s: float(v) for s, v in enumerate(values)}, {s: 0.0 for s in range(len(values))}, True)


def test_the_t_interval_and_p_value_of_five_gains_worked_by_hand():
    # gains 1..5: mean 3, sd sqrt(2.5) = 1.581139, se = 0.707107; t(0.975, 4) = 2.776445
    # (tables), half-width 1.963243; t = 3 / 0.707107 = 4.242641, one-sided p(t_4 > 4.242641) = 0.006618
    low, high = t_interval([1, 2, 3, 4, 5])
    assert low == pytest.approx(3 - 1.963243, abs=1e-6)
    assert high == pytest.approx(3 + 1.963243, abs=1e-6)
    assert t4_quantile(0.975) == pytest.approx(2.776445, abs=1e-6)
    assert one_sided_p([1, 2, 3, 4, 5]) == pytest.approx(t4_tail(math.sqrt(18)), rel=1e-9)
    assert t4_tail(math.sqrt(18)) == pytest.approx(0.006618, abs=1e-6)
    # against a bound of 1: t = 2 / 0.707107 = 2.828427, p(t_4 > 2.828427) = 0.023710
    assert one_sided_p([1, 2, 3, 4, 5], bound=1.0) == pytest.approx(t4_tail(math.sqrt(8)), rel=1e-9)
    assert t4_tail(math.sqrt(8)) == pytest.approx(0.023710, abs=1e-6)


def test_gains_are_paired_by_seed_and_oriented_by_the_metric():
    baseline = {0: 2.0, 1: 3.0, 2: 4.0, 7: 9.9}   # seed 7 has no partner and is left out
    variant = {2: 3.5, 0: 1.0, 1: 2.0, 5: 0.0}
    lower = paired_gain(variant, baseline, higher_is_better=False)   # a loss: lower is a gain
    assert lower.seeds == (0, 1, 2)
    assert lower.gains == (1.0, 1.0, 0.5)
    assert lower.mean == pytest.approx(2.5 / 3)
    assert lower.sd == pytest.approx(math.sqrt(1 / 12))                # deviations 1/6, 1/6, -1/3
    assert lower.effect_size == pytest.approx((2.5 / 3) / math.sqrt(1 / 12))
    higher = paired_gain(variant, baseline, higher_is_better=True)
    assert higher.gains == (-1.0, -1.0, -0.5)


def test_relabelled_or_reordered_seeds_give_the_same_verdict():
    rng = np.random.default_rng(0)
    base = {s: 1.0 + 0.1 * rng.standard_normal() for s in range(6)}
    var = {s: base[s] - 0.05 + 0.02 * rng.standard_normal() for s in range(6)}
    first = judge([paired_gain(var, base, higher_is_better=False)])[0]
    relabel = dict(zip(range(6), [11, 4, 97, 3, 50, 8]))            # one new label per seed, both sides
    order = list(range(6))
    random.Random(1).shuffle(order)
    var2 = {relabel[s]: var[s] for s in order}
    base2 = {relabel[s]: base[s] for s in reversed(order)}
    second = judge([paired_gain(var2, base2, higher_is_better=False)])[0]
    assert second.verdict is first.verdict is Verdict.SUPERIOR
    assert (second.gain.mean, second.low, second.high, second.p) == pytest.approx(
        (first.gain.mean, first.low, first.high, first.p), rel=1e-12)


def test_a_better_claim_is_superior_inferior_or_not_shown():
    assert judge([gains_of([1, 2, 3, 4, 5])])[0].verdict is Verdict.SUPERIOR       # [1.04, 4.96] above 0
    assert judge([gains_of([-1, -2, -3, -4, -5])])[0].verdict is Verdict.INFERIOR  # [-4.96, -1.04] below 0
    flat = gains_of([1, -1, 2, -2])                                                 # mean 0, interval about +-2.9
    covering = judge([flat], paper_gains=[0.5])[0]
    assert covering.verdict is Verdict.NOT_SHOWN and covering.note == "the interval covers the paper's effect"
    beyond = judge([flat], paper_gains=[50.0])[0]
    assert beyond.note == "the interval lies below the paper's effect: smaller here, if present"
    one = judge([paired_gain({0: 3.0}, {0: 1.0}, True)])[0]
    assert one.verdict is Verdict.NOT_SHOWN and "1 paired seed" in one.note
    with pytest.raises(ValueError, match="no margin"):
        judge([flat], "better", margins=[1.0])


def test_non_inferiority_and_its_qualifiers_worked_by_hand():
    # gains 1..5: 95% interval [1.036757, 4.963243]
    g = gains_of([1, 2, 3, 4, 5])
    wide = judge([g], "as_good", margins=[0.5])[0]          # above -0.5 and above 0, but reaches past +0.5
    assert wide.verdict is Verdict.NON_INFERIOR and str(wide.verdict) == "non-inferior within the margin"
    assert wide.note == "also superior: the interval excludes 0" and "equivalent" not in wide.note
    both = judge([g], "as_good", margins=[5.0])[0]           # within (-5, 5) too
    assert both.note == "also superior: the interval excludes 0; also equivalent (TOST)"
    # p against -0.5: t = 3.5 / 0.707107 = 4.949747
    assert wide.p == pytest.approx(t4_tail(3.5 / math.sqrt(0.5)), rel=1e-9)
    worse = judge([gains_of([-5, -4, -3, -2, -1])], "as_good", margins=[0.5])[0]   # [-4.96, -1.04] below -0.5
    assert (worse.verdict, worse.note) == (Verdict.INFERIOR, "worse than the margin")
    below_zero = judge([gains_of([-5, -4, -3, -2, -1])], "as_good", margins=[2.0])[0]  # reaches -2 from below 0
    assert (below_zero.verdict, below_zero.note) == (Verdict.NOT_SHOWN, "the interval lies below 0")
    # gains 0, -0.2, 0.2, -0.1, 0.1: mean 0, sd 0.158114, half-width 2.776445 * 0.070711 = 0.196324
    even = gains_of([0.0, -0.2, 0.2, -0.1, 0.1])
    assert (even.low, even.high) == pytest.approx((-0.196324, 0.196324), abs=1e-6)
    j = judge([even], "as_good", margins=[0.25])[0]
    assert j.verdict is Verdict.NON_INFERIOR and j.note == "also equivalent (TOST)"
    assert judge([even], "as_good", margins=[0.15])[0].verdict is Verdict.NOT_SHOWN     # -0.196 < -0.15
    # the rule is the interval's: p < ALPHA exactly when the lower bound clears -margin
    for margin in (0.18, 0.19, 0.2, 0.21):
        j = judge([even], "as_good", margins=[margin])[0]
        assert (j.p_adjusted < ALPHA) == (j.low > -margin) == (j.verdict is Verdict.NON_INFERIOR)


def test_the_audit_s_superior_interval_is_non_inferior_but_never_called_equivalent():
    # gain 0.097 [0.053, 0.141] with margin 0.043: sd = 0.044 sqrt(5) / t(0.975, 4)
    sd = 0.044 * math.sqrt(5) / t4_quantile(0.975)
    g = gains_of([0.097 + (k - 2) * sd / math.sqrt(2.5) for k in range(5)])
    assert (g.low, g.high) == pytest.approx((0.053, 0.141), abs=1e-9)
    j = judge([g], "as_good", margins=[0.043])[0]
    assert j.verdict is Verdict.NON_INFERIOR and j.note == "also superior: the interval excludes 0"
    t = judge([g], "equivalent", margins=[0.043])[0]     # 0.053 > +0.043: wholly beyond the margin
    assert (t.verdict, t.note) == (Verdict.NOT_EQUIVALENT, "different: superior beyond the margin")


def test_equivalence_is_two_one_sided_tests_worked_by_hand():
    g = gains_of([1, 2, 3, 4, 5])                            # [1.036757, 4.963243]
    eq = judge([g], "equivalent", margins=[5.0])[0]
    assert (eq.verdict, eq.note) == (Verdict.EQUIVALENT, "")
    # TOST p: the larger of p(t4 > (3 + 5) / 0.707107) and p(t4 > (5 - 3) / 0.707107) = 0.023710
    assert eq.p == pytest.approx(t4_tail(math.sqrt(8)), rel=1e-9)
    assert eq.p == pytest.approx(max(t4_tail(8 / math.sqrt(0.5)), t4_tail(2 / math.sqrt(0.5))), rel=1e-12)
    assert claim_p(g.gains, "equivalent", 5.0) == eq.p
    assert judge([g], "equivalent", margins=[2.0])[0].verdict is Verdict.NOT_SHOWN      # reaches past +2
    assert judge([g], "equivalent", margins=[4.9])[0].verdict is Verdict.NOT_SHOWN      # 4.96 > 4.9
    apart = judge([g], "equivalent", margins=[0.5])[0]
    assert (apart.verdict, apart.note) == (Verdict.NOT_EQUIVALENT, "different: superior beyond the margin")
    down = judge([gains_of([-5, -4, -3, -2, -1])], "equivalent", margins=[0.5])[0]
    assert (down.verdict, down.note) == (Verdict.NOT_EQUIVALENT, "different: inferior beyond the margin")
    # p < ALPHA exactly when the whole interval lies within (-margin, margin)
    for margin in (4.9, 4.96, 4.97, 5.5):
        j = judge([g], "equivalent", margins=[margin])[0]
        assert (j.p_adjusted < ALPHA) == (-margin < j.low and j.high < margin) == (j.verdict is Verdict.EQUIVALENT)
    with pytest.raises(ValueError, match="positive margin"):
        judge([g], "equivalent")


def test_bonferroni_widens_each_interval_to_the_claim_s_level():
    assert bonferroni_confidence(1) == pytest.approx(0.95) and bonferroni_confidence(4) == pytest.approx(0.9875)
    a, b = gains_of([1, 2, 3, 4, 5]), gains_of([0, 1, 2, 3, 4])
    alone = judge([b])[0]
    # one comparison: the 95% interval [0.036757, 3.963243], p = 0.023710 < 2.5%
    assert (alone.confidence, alone.m) == (pytest.approx(0.95), 1)
    assert (alone.low, alone.high) == pytest.approx((b.low, b.high), rel=1e-12)
    assert alone.p == alone.p_adjusted == pytest.approx(t4_tail(math.sqrt(8)), rel=1e-9)
    assert alone.verdict is Verdict.SUPERIOR
    together = judge([a, b])
    # two: each interval at 97.5%, half-width t(0.9875, 4) x se = 3.495406 x 0.707107 = 2.471625
    half = t4_quantile(0.9875) * math.sqrt(0.5)
    assert half == pytest.approx(2.471625, abs=1e-6)
    assert [(j.low, j.high) for j in together] == [pytest.approx((3 - half, 3 + half), abs=1e-9),
                                                   pytest.approx((2 - half, 2 + half), abs=1e-9)]
    assert [j.confidence for j in together] == [pytest.approx(0.975)] * 2
    # p x 2: 0.013236 passes 2.5%, 0.047420 does not, and b's interval now reaches below 0
    assert together[0].p_adjusted == pytest.approx(2 * t4_tail(math.sqrt(18)), rel=1e-9)
    assert together[1].p_adjusted == pytest.approx(2 * t4_tail(math.sqrt(8)), rel=1e-9)
    assert [j.verdict for j in together] == [Verdict.SUPERIOR, Verdict.NOT_SHOWN]
    # a claim declared with 3 pairs of which one has run is still corrected for 3; p is capped at 1
    three = judge([b], m=3)[0]
    assert three.confidence == pytest.approx(1 - 0.05 / 3) and three.p_adjusted == pytest.approx(3 * alone.p)
    assert judge([gains_of([-1, -2, -3, -4, -5])], m=3)[0].p_adjusted == 1.0
    assert verdict_of(b.gains, "better", None, 1) is Verdict.SUPERIOR
    assert verdict_of(b.gains, "better", None, 2) is Verdict.NOT_SHOWN


def test_each_comparison_is_judged_against_its_own_margin():
    # two pairs of one claim whose baselines differ tenfold: a 1% margin is 0.022 on one, 0.222 on the other
    first = gains_of([0.0, -0.002, 0.002, -0.001, 0.001])
    second = gains_of([-0.1, -0.102, -0.098, -0.101, -0.099])      # 97.5% interval about [-0.1025, -0.0975]
    right = judge([first, second], "as_good", margins=[0.022, 0.222])
    assert [j.verdict for j in right] == [Verdict.NON_INFERIOR, Verdict.NON_INFERIOR]
    assert [j.margin for j in right] == [0.022, 0.222]
    # the first baseline's margin on both (the old bug) calls the second inferior
    assert judge([first, second], "as_good", margins=[0.022, 0.022])[1].verdict is Verdict.INFERIOR
    with pytest.raises(ValueError, match="one margin and one paper gain per comparison"):
        judge([first, second], "as_good", margins=[0.022])


def test_decide_reads_the_verdict_off_the_interval():
    assert decide(0.1, 0.2, "better") == (Verdict.SUPERIOR, "")
    assert decide(0.0, 0.2, "better") == (Verdict.NOT_SHOWN, "")          # touching the bound is not excluding it
    assert decide(-0.5, 0.5, "equivalent", 0.5) == (Verdict.NOT_SHOWN, "")
    assert decide(-0.4, 0.4, "equivalent", 0.5) == (Verdict.EQUIVALENT, "")
    assert decide(math.nan, math.nan, "as_good", 0.5) == (Verdict.NOT_SHOWN, "")


def simulated_power(n: int, sd: float, true_gain: float, test: str, margin: float | None, alpha: float,
                    draws: int = 200_000, seed: int = 0) -> float:
    """The share of ``draws`` seeded normal samples of ``n`` gains on which the claim's t test(s) reject."""
    x = true_gain + sd * np.random.default_rng(seed).standard_normal((draws, n))
    mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    crit = sps.t.ppf(1 - alpha, n - 1)
    if test == "better":
        return float(np.mean(mean / se > crit))
    if test == "as_good":
        return float(np.mean((mean + margin) / se > crit))
    return float(np.mean(((mean + margin) / se > crit) & ((margin - mean) / se > crit)))


@pytest.mark.parametrize("n, sd, true_gain, test, margin, alpha", [
    (8, 0.035436, 0.0, "as_good", 0.043, ALPHA),            # the depth-for-heads row at its 80% seeds
    (5, 1.0, 0.8, "better", None, ALPHA / 2),               # superiority at a paper's effect, a claim of 2
    (10, 0.035436, 0.0, "equivalent", 0.043, ALPHA),        # TOST at a true gain of 0
    (5, 1.0, 0.3, "equivalent", 1.5, ALPHA),                # TOST off centre
    (2, 1.0, 0.0, "equivalent", 3.0, ALPHA),                # one degree of freedom
])
def test_the_power_agrees_with_a_seeded_simulation_of_the_t_test(n, sd, true_gain, test, margin, alpha):
    exact = power(n, sd, test, true_gain=true_gain, margin=margin, alpha=alpha)
    assert exact == pytest.approx(simulated_power(n, sd, true_gain, test, margin, alpha), abs=0.005)


def test_the_power_in_hand_cases():
    # at the bound the test rejects at its level exactly (the noncentral t with no noncentrality is t)
    assert power(5, 1.0, "as_good", true_gain=-0.5, margin=0.5) == pytest.approx(ALPHA, rel=1e-9)
    assert power(7, 2.0, "better", true_gain=0.0, alpha=0.01) == pytest.approx(0.01, rel=1e-9)
    # large n: the normal approximation Phi(delta sqrt(n) / sd - z 0.975)
    assert power(4000, 1.0, "as_good", true_gain=0.0, margin=0.05) == pytest.approx(
        sps.norm.cdf(0.05 * math.sqrt(4000) - 1.959964), abs=2e-3)
    # TOST at a true gain of 0 with a huge n: both tests reject almost surely; at the margin, at most alpha
    assert power(2000, 1.0, "equivalent", true_gain=0.0, margin=0.5) == pytest.approx(1.0, abs=1e-9)
    assert power(20, 1.0, "equivalent", true_gain=0.8, margin=0.8) <= ALPHA
    # no spread: the test decides without error
    assert power(3, 0.0, "better", true_gain=0.1) == 1.0 and power(3, 0.0, "equivalent", true_gain=1, margin=1) == 0


@pytest.mark.parametrize("half_width, margin, seeds", [(1.66, 1.0, 17), (2.21, 1.0, 27), (0.044, 0.043, 8)])
def test_the_audit_s_seed_counts_for_80_percent_power_to_show_non_inferiority(half_width, margin, seeds):
    # the LRA, ViT and depth-for-heads rows: 5 seeds gave these 95% half-widths
    sd = half_width * math.sqrt(5) / t4_quantile(0.975)
    assert seeds_for_power(sd, "as_good", true_gain=0.0, margin=margin) == seeds
    # the fewest: one seed fewer falls short of 80%
    assert power(seeds - 1, sd, "as_good", true_gain=0.0, margin=margin) < 0.8
    assert power(seeds, sd, "as_good", true_gain=0.0, margin=margin) >= 0.8


def test_seeds_for_power_of_each_test():
    sd = 0.044 * math.sqrt(5) / t4_quantile(0.975)
    tost = seeds_for_power(sd, "equivalent", true_gain=0.0, margin=0.043)
    assert tost is not None and tost > 8                    # both sides must clear their bound
    assert power(tost - 1, sd, "equivalent", true_gain=0.0, margin=0.043) < 0.8 <= \
        power(tost, sd, "equivalent", true_gain=0.0, margin=0.043)
    # a stricter level (a claim of 3) needs more seeds
    assert seeds_for_power(sd, "as_good", true_gain=0.0, margin=0.043, alpha=ALPHA / 3) > 8
    # a true gain on the wrong side of the bound is never shown; a tiny one needs too many
    assert seeds_for_power(1.0, "better", true_gain=0.0) is None
    assert seeds_for_power(1.0, "equivalent", true_gain=1.0, margin=1.0) is None
    assert seeds_for_power(1.0, "better", true_gain=0.01) is None
    assert seeds_for_power(1.0, "better", true_gain=100.0) == 2   # two seeds: t(0.975, 1) = 12.7 still passes


def test_the_detectable_gain_has_the_stated_power():
    # large n: the normal approximation (z 0.975 + z 0.8 = 1.959964 + 0.841621) * sd / sqrt(n)
    assert detectable_gain(2000, 1.0) == pytest.approx(2.801585 / math.sqrt(2000), rel=2e-3)
    # small n, checked by simulation: at the detectable gain the test rejects 80% of the time
    n, sd = 5, 0.4
    delta = detectable_gain(n, sd)
    assert simulated_power(n, sd, delta, "better", None, ALPHA) == pytest.approx(0.8, abs=0.005)
    # a claim of two: judged at ALPHA / 2, so a larger gain is needed
    assert judge([gains_of([1, 2, 3, 4, 5])] * 2)[0].detectable == pytest.approx(
        detectable_gain(5, math.sqrt(2.5), ALPHA / 2), rel=1e-12)
    assert detectable_gain(5, 1.0, ALPHA / 2) > detectable_gain(5, 1.0)


def simulated_tost_power(n: int, sd: float, true_gain: float, margin: float, alpha: float,
                         draws: int = 400_000, seed: int = 0) -> float:
    """The TOST's seeded rejection rate for any ``n``, drawing each sample's sufficient statistics
    (normal theory: the mean ~ N(true_gain, sd^2 / n) and, independently, (n - 1) s^2 / sd^2 ~
    chi^2(n - 1)) instead of its ``n`` gains."""
    rng = np.random.default_rng(seed)
    mean = true_gain + sd / math.sqrt(n) * rng.standard_normal(draws)
    se = sd * np.sqrt(rng.chisquare(n - 1, draws) / (n - 1)) / math.sqrt(n)
    crit = sps.t.ppf(1 - alpha, n - 1)
    return float(np.mean(((mean + margin) / se > crit) & ((margin - mean) / se > crit)))


@pytest.mark.parametrize("n, margin, true_gain", [
    (100_000, 0.01, 0.0),        # the chi density is a narrow spike far inside the integration range
    (1_000_000, 0.003, 0.001),
    (30, 5.0, 0.0),
])
def test_the_tost_power_finds_the_chi_density_s_bulk(n, margin, true_gain):
    exact = power(n, 1.0, "equivalent", true_gain=true_gain, margin=margin)
    assert exact == pytest.approx(simulated_tost_power(n, 1.0, true_gain, margin, ALPHA), abs=0.005)


def test_the_tost_power_tends_to_one_as_the_margin_grows():
    # 1 - power <= P(|mean| > margin / 2) + P(c s / sqrt(n) > margin / 2): with a margin of 1000 sd
    # both are far below a double's resolution
    assert power(30, 1.0, "equivalent", true_gain=0.0, margin=1000.0) == pytest.approx(1.0, abs=1e-12)
    # n = 2: s = sd |W|, W ~ N(0, 1), so 1 - power <= P(|W| > margin sqrt(2) / (c sd)) = 2 Phi(-8.9e4), also 0
    assert power(2, 1.0, "equivalent", true_gain=0.0, margin=1e6) == pytest.approx(1.0, abs=1e-12)


def test_the_one_sided_power_when_the_effect_dwarfs_the_spread():
    # where scipy's noncentral t is finite the power is its survival function at the critical t
    crit = sps.t.ppf(1 - ALPHA, 9)
    assert power(10, 1e-4, "as_good", true_gain=0.0, margin=1.0) == sps.nct.sf(crit, 9, 1e4 * math.sqrt(10))
    # beyond it the limit: 1 - power <= P(chi_9 / 3 > nc / crit), nil for nc = 3e9, and 0 for a gain as far below
    assert power(10, 1e-9, "as_good", true_gain=0.0, margin=1.0) == 1.0
    assert power(10, 1e-9, "better", true_gain=-1.0) == 0.0
    # so two seeds suffice, as with no spread at all (power(2, 0.0, ...) = 1)
    assert seeds_for_power(1e-10, "as_good", true_gain=0.0, margin=1.0) == 2


def two_seed_rejection(mean: float, crit: float, low: float, high: float) -> float:
    """P(low < Y + crit W < high and low < Y - crit W < high) for independent Y ~ N(mean, 1) and
    W ~ N(0, 1), by scipy's bivariate normal cdf (the two sums are jointly normal).

    With two gains, Y = sqrt(2) mean gain / sd and W = (gain 1 - gain 2) / (sqrt(2) sd), so that
    the t statistic is Y / |W|: the one-sided test at bound 0 rejects iff Y > crit |W| (the
    quadrant low = 0, high = inf), the TOST at margin M iff |Y| + crit |W| < sqrt(2) M / sd (the
    square high = -low = sqrt(2) M / sd), as |a| + |b| = max(|a + b|, |a - b|)."""
    cov = [[1 + crit ** 2, 1 - crit ** 2], [1 - crit ** 2, 1 + crit ** 2]]
    return float(sps.multivariate_normal([mean, mean], cov).cdf([high, high], lower_limit=[low, low]))


@pytest.mark.parametrize("sd, true_gain, margin, alpha", [
    (1.0, 0.0, 3.0, ALPHA),
    (0.006044, -5.3255, 8.0038, ALPHA / 9),    # far in the chi(1) tail: the old quadrature was 1e-9 short
    (1.0, 0.5, 20.0, ALPHA),
    (1.0, 0.0, 1e6, ALPHA),                    # the old quadrature gave 0
])
def test_the_tost_power_at_two_seeds_is_a_bivariate_normal_square(sd, true_gain, margin, alpha):
    bound = math.sqrt(2) * margin / sd
    exact = two_seed_rejection(math.sqrt(2) * true_gain / sd, sps.t.ppf(1 - alpha, 1), -bound, bound)
    tost = power(2, sd, "equivalent", true_gain=true_gain, margin=margin, alpha=alpha)
    assert tost == pytest.approx(exact, abs=1e-12)


def test_the_detectable_gain_of_a_claim_with_many_pairs_at_two_seeds():
    # at ALPHA / 9 and one degree of freedom the standardised effect lies beyond 100
    delta = detectable_gain(2, 1.0, ALPHA / 9)
    crit = sps.t.ppf(1 - ALPHA / 9, 1)
    assert two_seed_rejection(math.sqrt(2) * delta, crit, 0.0, math.inf) == pytest.approx(0.8, abs=1e-9)
    judged = judge([gains_of([1.0, 2.0])] * 9)
    assert judged[0].detectable == pytest.approx(detectable_gain(2, math.sqrt(0.5), ALPHA / 9), rel=1e-12)
