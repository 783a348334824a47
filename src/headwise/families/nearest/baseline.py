"""The nearest-neighbour target's variants and its "learned nothing" loss, which the ``[task]``
table, the task and the report read (no torch)."""

from __future__ import annotations

import functools

VARIANTS = ("farthest", "query-nearest")


def expected_max_inner(dim: int, count: int) -> float:
    """E[max of ``count`` inner products <u, x_j>] for a fixed unit u and x_j uniform on S^(d-1).

    <u, x> has CDF ``F(t) = I_((1+t)/2)((d-1)/2, (d-1)/2)``, so ``E[max] = 1 - int_-1^1 F(t)^count dt``.
    """
    from scipy.integrate import quad
    from scipy.special import betainc

    a = (dim - 1) / 2
    area, _ = quad(lambda t: betainc(a, a, (1 + t) / 2) ** count, -1.0, 1.0, limit=200, epsabs=1e-12)
    return 1.0 - area


@functools.lru_cache(maxsize=None)
def baseline_loss(dim: int, n_points: int, variant: str = "farthest") -> float:
    """The "learned nothing" loss: the best prediction of the form ``-c x_i`` (``c y_k`` for
    queries) scores ``1 - m^2``, m the expected largest inner product with the other N-1 points
    (with all N points for a query). Predicting 0 scores 1."""
    count = n_points - 1 if variant == "farthest" else n_points
    return 1.0 - expected_max_inner(dim, count) ** 2
