"""Study statistics against closed forms and hand-computed references."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from headwise.report import stats


def test_exponential_fit_recovers_exact_parameters():
    # Points on a known curve: the fit must return its parameters.
    x = np.array([45, 48, 90, 96, 180, 192], dtype=float)
    y = 2.0 + 1.5 * np.exp(-0.02 * x)
    fit = stats.fit_exponential(x, y)
    assert fit is not None and fit.form == "loss = a + b * exp(-c * heads)"
    assert (fit.a, fit.b, fit.c) == pytest.approx((2.0, 1.5, 0.02), rel=1e-6)
    assert fit.rmse < 1e-9 and fit.note == ""
    assert fit(120.0) == pytest.approx(2.0 + 1.5 * math.exp(-2.4))


def test_three_points_are_interpolated():
    # Three parameters through three points: zero residual, as the blog's fits.
    x, y = [45, 90, 180], [3.10, 2.90, 2.85]
    fit = stats.fit_exponential(x, y)
    assert fit is not None
    assert [float(fit(v)) for v in x] == pytest.approx(y, abs=1e-7)


def test_fit_needs_three_distinct_totals_and_flags_degenerate_data():
    assert stats.fit_exponential([45, 45, 90], [3.0, 3.1, 2.9]) is None
    assert stats.fit_exponential([45, 90], [3.0, 2.9]) is None
    line = stats.fit_exponential([1, 2, 3], [1.0, 2.0, 3.0])  # a straight line: c is not determined
    assert line is not None and "straight-line limit" in line.note
    assert [float(line(v)) for v in (1, 2, 3)] == pytest.approx([1.0, 2.0, 3.0], abs=1e-3)


def test_percent_difference_sign_convention():
    assert stats.percent_difference(0.997, 1.0) == pytest.approx(-0.3)  # lower loss: negative = better
    assert stats.percent_difference(1.045, 1.0) == pytest.approx(4.5)


def test_seed_stats_ignore_missing_values():
    s = stats.seed_stats([1.0, 2.0, None, 4.0, float("nan")])
    assert s.n == 3 and s.mean == pytest.approx(7 / 3)
    assert s.std == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    one = stats.seed_stats([1.5])
    assert one.n == 1 and one.mean == 1.5 and math.isnan(one.std)


def test_welch_test_matches_the_textbook_formula():
    a = [2.31, 2.35, 2.29, 2.33]
    b = [2.40, 2.38, 2.45]
    t, p = stats.welch_test(a, b)
    # Welch's t and the Welch-Satterthwaite degrees of freedom, by hand
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t_ref = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    p_ref = 2 * sps.t.sf(abs(t_ref), df)
    assert t == pytest.approx(t_ref, rel=1e-10) and p == pytest.approx(p_ref, rel=1e-8)


def test_welch_test_needs_two_values_each():
    assert all(math.isnan(v) for v in stats.welch_test([1.0], [1.0, 2.0]))
    assert all(math.isnan(v) for v in stats.welch_test([1.0, 1.0], [1.0, 1.0]))  # no spread at all


def test_compare_reports_difference_and_test():
    c = stats.compare("desc", [2.0, 2.2], "const", [3.0, 3.2])
    assert c.difference == pytest.approx(-1.0) and c.percent == pytest.approx(-100 / 3.1)
    assert c.testable and c.p < 0.05


def test_holm_step_down_by_hand():
    # sorted p: 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept monotone at 0.06)
    adj = stats.holm([0.01, 0.04, float("nan"), 0.03])
    assert adj[0] == pytest.approx(0.03) and adj[1] == pytest.approx(0.06) and adj[3] == pytest.approx(0.06)
    assert math.isnan(adj[2])
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]


def _series(noise: float, seeds: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    true = {"constant": (2.0, 1.5, 0.02), "descending": (1.95, 1.5, 0.02)}
    return {name: [(t, list(a + b * math.exp(-c * t) + rng.normal(0, noise, size=seeds))) for t in (45, 90, 180)]
            for name, (a, b, c) in true.items()}


def test_bootstrap_interval_without_noise_is_the_closed_form():
    ci = stats.bootstrap_fit_difference(_series(0.0), "constant", 180, draws=50)
    truth = stats.percent_difference(1.95 + 1.5 * math.exp(-3.6), 2.0 + 1.5 * math.exp(-3.6))
    assert ci["descending"] == pytest.approx((truth, truth), abs=1e-6)


def test_bootstrap_interval_brackets_the_estimate_and_widens_with_noise():
    widths = []
    for noise in (0.005, 0.02):
        series = _series(noise)
        ci = stats.bootstrap_fit_difference(series, "constant", 180, draws=200)
        fits = {k: stats.fit_exponential([t for t, _ in v], [float(np.mean(x)) for _, x in v]) for k, v in series.items()}
        estimate = stats.percent_difference(float(fits["descending"](180)), float(fits["constant"](180)))
        lo, hi = ci["descending"]
        assert lo < estimate < hi
        widths.append(hi - lo)
    assert widths[1] > 2 * widths[0]
    # one seed per point: nothing to resample
    single = {k: [(t, v[:1]) for t, v in pts] for k, pts in _series(0.01).items()}
    assert stats.bootstrap_fit_difference(single, "constant", 180) == {}
