"""Paired comparisons and verdicts (headwise.report.paired) against values worked by hand."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from headwise.report.paired import (
    ALPHA, Verdict, detectable_gain, judge, one_sided_p, paired_gain, seeds_for, t_interval,
)


def t4_tail(t: float) -> float:
    """P(T > t) for Student's t with 4 degrees of freedom, in closed form:
    1/2 - (3/8) x (1 - t^2 / (12 s)) with s = 1 + t^2 / 4 and x = t / sqrt(s)."""
    s = 1 + t * t / 4
    return 0.5 - 0.375 * (t / math.sqrt(s)) * (1 - t * t / (12 * s))


def test_the_t_interval_and_p_value_of_five_gains_worked_by_hand():
    # gains 1..5: mean 3, sd sqrt(2.5) = 1.581139, se = 0.707107; t(0.975, 4) = 2.776445
    # (tables), half-width 1.963243; t = 3 / 0.707107 = 4.242641, one-sided p(t_4 > 4.242641) = 0.006618
    low, high = t_interval([1, 2, 3, 4, 5])
    assert low == pytest.approx(3 - 1.963243, abs=1e-6)
    assert high == pytest.approx(3 + 1.963243, abs=1e-6)
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
    assert second.verdict is first.verdict is Verdict.REPRODUCED
    assert (second.gain.mean, second.gain.low, second.gain.high, second.p) == pytest.approx(
        (first.gain.mean, first.gain.low, first.gain.high, first.p), rel=1e-12)


def test_a_better_claim_is_reproduced_contradicted_or_not_shown():
    assert judge([paired_gain({0: 1, 1: 2, 2: 3, 3: 4, 4: 5}, {s: 0 for s in range(5)}, True)])[0].verdict \
        is Verdict.REPRODUCED                              # interval [1.04, 4.96] above zero
    assert judge([paired_gain({s: 0 for s in range(5)}, {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}, True)])[0].verdict \
        is Verdict.CONTRADICTED
    covering = judge([paired_gain({0: 1, 1: -1, 2: 2, 3: -2}, {s: 0 for s in range(4)}, True)], paper_gain=0.5)[0]
    assert covering.verdict is Verdict.NOT_SHOWN and "covers both" in covering.note
    excluding = judge([paired_gain({0: 1, 1: -1, 2: 2, 3: -2}, {s: 0 for s in range(4)}, True)], paper_gain=50.0)[0]
    assert "excludes the paper's effect" in excluding.note
    one = judge([paired_gain({0: 3.0}, {0: 1.0}, True)])[0]
    assert one.verdict is Verdict.NOT_SHOWN and "1 paired seed" in one.note


def test_non_inferiority_needs_the_whole_interval_above_minus_the_margin():
    # gains 0, -0.2, 0.2, -0.1, 0.1: mean 0, sd 0.158114, half-width 2.776445 * 0.070711 = 0.196324
    gains = {0: 0.0, 1: -0.2, 2: 0.2, 3: -0.1, 4: 0.1}
    zero = {s: 0.0 for s in gains}
    g = paired_gain(gains, zero, True)
    assert (g.low, g.high) == pytest.approx((-0.196324, 0.196324), abs=1e-6)
    assert judge([g], margin=0.25)[0].verdict is Verdict.EQUIVALENT      # -0.196 > -0.25
    assert judge([g], margin=0.15)[0].verdict is Verdict.NOT_SHOWN       # -0.196 < -0.15 < 0.196
    worse = paired_gain({s: v - 1.0 for s, v in gains.items()}, zero, True)   # interval [-1.20, -0.80]
    assert judge([worse], margin=0.5)[0].verdict is Verdict.CONTRADICTED
    # the rule is the interval's: p < ALPHA exactly when the lower bound clears -margin
    for margin in (0.18, 0.19, 0.2, 0.21):
        j = judge([g], margin=margin)[0]
        assert (j.p < ALPHA) == (g.low > -margin)


def test_holm_runs_over_the_comparisons_of_one_claim():
    # one-sided p-values 0.006618 (gains 1..5) and 0.023710 (gains 0..4: t = 2 / 0.707107 = 2.828427)
    a = paired_gain({0: 1, 1: 2, 2: 3, 3: 4, 4: 5}, {s: 0 for s in range(5)}, True)
    b = paired_gain({0: 0, 1: 1, 2: 2, 3: 3, 4: 4}, {s: 0 for s in range(5)}, True)
    alone = judge([b])[0]
    assert alone.p == pytest.approx(t4_tail(math.sqrt(8)), rel=1e-9) and alone.verdict is Verdict.REPRODUCED
    together = judge([a, b])
    # Holm: the smaller p times 2, the larger times 1 (and never below the one before it); 0.023710
    # alone passes 2.5%, and still does as the larger of two
    assert together[0].p_holm == pytest.approx(2 * t4_tail(math.sqrt(18)), rel=1e-9)
    assert together[1].p_holm == pytest.approx(t4_tail(math.sqrt(8)), rel=1e-9)
    assert [j.verdict for j in together] == [Verdict.REPRODUCED, Verdict.REPRODUCED]
    # a family of three copies of b: 3 x 0.023710 > 2.5%, so none is shown
    assert {j.verdict for j in judge([b, b, b])} == {Verdict.NOT_SHOWN}


def test_the_detectable_gain_has_the_stated_power():
    # large n: the normal approximation (z 0.975 + z 0.8 = 1.959964 + 0.841621) * sd / sqrt(n)
    assert detectable_gain(2000, 1.0) == pytest.approx(2.801585 / math.sqrt(2000), rel=2e-3)
    # small n, checked by simulation: at the detectable gain the test rejects 80% of the time
    n, sd = 5, 0.4
    delta = detectable_gain(n, sd)
    rng = np.random.default_rng(3)
    samples = delta + sd * rng.standard_normal((20000, n))
    rejected = np.mean([one_sided_p(row) < ALPHA for row in samples[:4000]])
    assert rejected == pytest.approx(0.8, abs=0.025)


def test_seeds_for_a_half_width():
    # sd 1: n = 5 gives 2.776445 / sqrt(5) = 1.2417, n = 6 gives 2.570582 / sqrt(6) = 1.0494
    assert seeds_for(1.25, 1.0) == 5
    assert seeds_for(1.2, 1.0) == 6
    assert seeds_for(0.0, 1.0) is None
