"""Head plans: turn a scheme and a budget of heads into per-layer head counts.

Schemes
  constant    the same count in every layer
  ascending   geometric growth through the layers, ``ratio`` (default 2) per layer
  descending  geometric decay through the layers
  linear      an arithmetic ramp from the first layer's count to ``ratio`` times it
              (ratio < 1 ramps down)
  explicit    a given list, only validated

A count is valid when it is at least 1 and, with the standard tie ``head_dim = d_model / heads``,
divides ``d_model``. When no valid plan of the scheme has exactly the requested total, the valid
plan with the nearest total is chosen (fewer heads on a tie) and the plan says so.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Literal, Sequence

from headwise.errors import HeadwiseError
from headwise.spec import divisors

Scheme = Literal["constant", "ascending", "descending", "linear", "explicit"]
SCHEMES: tuple[str, ...] = ("constant", "ascending", "descending", "linear", "explicit")


@dataclass(frozen=True)
class HeadPlan:
    """Per-layer head counts chosen for a scheme and a requested total."""

    scheme: str
    heads: list[int]
    requested_total: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.heads)

    @property
    def exact(self) -> bool:
        return self.requested_total is None or self.total == self.requested_total


def valid_counts(d_model: int, tied: bool, limit: int) -> list[int]:
    """Head counts allowed in one layer: divisors of d_model when head_dim is tied to it,
    else every count up to ``limit``."""
    return divisors(d_model) if tied else list(range(1, limit + 1))


def _nearest(valid: Sequence[int], x: float) -> int:
    """The valid count nearest to x (the smaller on a tie); ``valid`` is sorted."""
    i = bisect.bisect_left(valid, x)
    near = valid[max(i - 1, 0): i + 1]
    return min(near, key=lambda v: (abs(v - x), v))


def _shape(scheme: str, n_layers: int, ratio: float) -> list[float]:
    """Relative sizes of the layers for a scheme, the smallest entry being 1."""
    if scheme == "constant":
        return [1.0] * n_layers
    if scheme == "ascending":
        return [ratio**i for i in range(n_layers)]
    if scheme == "descending":
        return [ratio ** (n_layers - 1 - i) for i in range(n_layers)]
    # linear: from 1 to ratio in equal steps (ratio < 1 ramps down; rescaled so min is 1)
    steps = [1.0 + (ratio - 1.0) * i / max(n_layers - 1, 1) for i in range(n_layers)]
    low = min(steps)
    return [s / low for s in steps]


def plan_heads(
    scheme: str,
    n_layers: int,
    d_model: int,
    total_heads: int | None = None,
    *,
    ratio: float = 2.0,
    heads: Sequence[int] | None = None,
    head_dim: int | None = None,
) -> HeadPlan:
    """Choose per-layer head counts.

    Args:
        scheme: one of :data:`SCHEMES`.
        n_layers, d_model: the model's depth and width.
        total_heads: the budget (required unless ``scheme == "explicit"``).
        ratio: growth per layer for ascending/descending, last/first for linear.
        heads: the counts for ``scheme == "explicit"``.
        head_dim: a fixed head width decoupled from d_model (then any count >= 1 is valid);
            None ties head_dim to d_model / heads.
    """
    if n_layers < 1:
        raise HeadwiseError(f"n_layers = {n_layers}; a model needs at least 1 layer")
    if d_model < 1:
        raise HeadwiseError(f"d_model = {d_model}; it must be a positive integer")
    if scheme not in SCHEMES:
        raise HeadwiseError(f"unknown scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}")
    tied = head_dim is None
    if scheme == "explicit":
        if heads is None:
            raise HeadwiseError("scheme 'explicit' needs the list of heads per layer (e.g. --heads 96,48,24,12)")
        heads = list(heads)
        if len(heads) != n_layers:
            raise HeadwiseError(f"{len(heads)} head counts given for {n_layers} layers: give one per layer")
        for i, h in enumerate(heads):
            if h < 1:
                raise HeadwiseError(f"layer {i}: heads = {h}; every layer needs at least 1 head")
            if tied and d_model % h:
                valid = ", ".join(map(str, divisors(d_model)))
                raise HeadwiseError(f"layer {i}: heads = {h} does not divide d_model {d_model}; valid counts: {valid}")
        return HeadPlan("explicit", heads, total_heads)
    if total_heads is None or total_heads < n_layers:
        raise HeadwiseError(
            f"total_heads = {total_heads}; scheme {scheme!r} needs a budget of at least {n_layers} (one head per layer)"
        )
    if ratio <= 0 or (scheme in ("ascending", "descending") and ratio < 1):
        raise HeadwiseError(f"ratio = {ratio}; use a ratio >= 1 (the scheme sets the direction)")
    valid = valid_counts(d_model, tied, limit=total_heads)
    shape = _shape(scheme, n_layers, ratio)
    # Every candidate plan is the shape scaled by a base size, each layer snapped to a valid
    # count; the base runs in steps of 1/16 up to the largest valid count, which reaches every
    # plan the snapping can produce for ratios used in practice.
    bases = (k / 16 for k in range(16, 16 * valid[-1] + 1))
    candidates = {tuple(_nearest(valid, base * s) for s in shape) for base in bases}
    best = min(candidates, key=lambda c: (abs(sum(c) - total_heads), sum(c)))
    plan = HeadPlan(scheme, list(best), total_heads)
    if not plan.exact:
        why = f"divisors of d_model {d_model}" if tied else "positive integers"
        plan.notes.append(
            f"no {scheme} plan of valid counts ({why}) totals exactly {total_heads} heads; "
            f"nearest is {plan.total}"
        )
    return plan
