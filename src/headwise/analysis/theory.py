"""Theorem 3.2 of Leaner Transformers, measured: the condition number of i.i.d. Gaussian blocks.

For ``A = [A_1 ... A_h]`` of shape ``N x D`` with i.i.d. standard Gaussian entries, the extreme
singular values are close to ``sqrt(D) +- sqrt(N)`` (Bai-Yin), so
``kappa(A) ~ (sqrt(D) + sqrt(N)) / (sqrt(D) - sqrt(N))``; with a fixed head width ``d`` and
``D = h d``, ``kappa -> 1`` as ``h -> infinity``. At finite sizes the measured value sits below
the closed form (the largest singular value falls short of its limit and the smallest exceeds
it, by ``O(N^(-1/6))`` Tracy-Widom corrections), the more so the smaller ``N`` and ``D / N``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from headwise.analysis.conditioning import condition_number

#: Default grid: tokens N, and the ratios D / N of width to tokens.
GRID_N = (16, 32, 64, 128)
GRID_RATIOS = (2, 4, 8, 16, 32)
#: Default heads sweep: N tokens, head width d, and the head counts h (D = h d).
SWEEP_N = 128
SWEEP_HEAD_DIM = 64
SWEEP_HEADS = (1, 2, 3, 4, 6, 8, 16, 32, 64)


def closed_form_kappa(n: int, d: int) -> float:
    """``(sqrt(big) + sqrt(small)) / (sqrt(big) - sqrt(small))`` for an ``n x d`` Gaussian matrix
    (Theorem 3.2's form when ``d > n``; symmetric in ``n, d``); ``inf`` for a square matrix."""
    big, small = math.sqrt(max(n, d)), math.sqrt(min(n, d))
    return math.inf if big == small else (big + small) / (big - small)


def gaussian_kappas(n: int, d: int, seeds: int, seed: int = 0) -> np.ndarray:
    """Measured condition numbers of ``seeds`` independent ``n x d`` standard Gaussian matrices
    (float64; seed ``seed + s`` for the ``s``-th)."""
    out = []
    for s in range(seeds):
        g = torch.Generator().manual_seed(seed + s)
        out.append(float(condition_number(torch.randn(n, d, generator=g, dtype=torch.float64))))
    return np.array(out)


def _row(n: int, d: int, seeds: int, seed: int) -> dict[str, Any]:
    kappas = gaussian_kappas(n, d, seeds, seed)
    mean, closed = float(kappas.mean()), closed_form_kappa(n, d)
    return dict(
        n=n, d=d, ratio=d / n, seeds=seeds, kappa_mean=mean,
        kappa_std=float(kappas.std(ddof=1)) if seeds > 1 else 0.0,
        kappa_median=float(np.median(kappas)), kappa_min=float(kappas.min()), kappa_max=float(kappas.max()),
        closed_form=closed,
        rel_error=(mean - closed) / closed if math.isfinite(closed) else math.nan,
    )


def theory_grid(ns=GRID_N, ratios=GRID_RATIOS, seeds: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Measured mean kappa against the closed form for every ``N`` in ``ns`` and ``D = r N``,
    one row per cell: n, d, ratio, seeds, kappa_mean, kappa_std, kappa_median, kappa_min,
    kappa_max, closed_form, rel_error ((measured - closed) / closed)."""
    return [_row(n, int(r * n), seeds, seed) for n in ns for r in ratios]


def heads_sweep(n: int = SWEEP_N, head_dim: int = SWEEP_HEAD_DIM, heads=SWEEP_HEADS,
                seeds: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """kappa of ``[A_1 ... A_h]`` with ``N = n`` tokens and fixed head width: one row per ``h``
    (the grid's columns plus ``heads`` and ``head_dim``); ``D = h * head_dim``."""
    return [dict(heads=h, head_dim=head_dim, **_row(n, h * head_dim, seeds, seed)) for h in heads]
