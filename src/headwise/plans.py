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
import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from headwise.errors import HeadwiseError
from headwise.spec import divisors


class Scheme(str, Enum):
    """How heads are spread over the layers."""

    CONSTANT = "constant"
    ASCENDING = "ascending"
    DESCENDING = "descending"
    LINEAR = "linear"
    EXPLICIT = "explicit"

    def __str__(self) -> str:
        return self.value


SCHEMES: tuple[str, ...] = tuple(s.value for s in Scheme)


@dataclass(frozen=True)
class Plan:
    """A head plan, resolved: what was asked (scheme, budget, ratio) and what came out (heads and
    head widths per layer, with notes when the budget could not be met exactly).

    It is made once, by :func:`plan_heads` (or :meth:`explicit` for heads given per layer), and
    carried as it is through the run config, the run summary, a study's results and its report.
    """

    scheme: Scheme
    heads: tuple[int, ...]
    #: per-layer head widths; empty when the plan was made without knowing them (see :meth:`with_head_dims`)
    head_dims: tuple[int, ...] = ()
    requested_total: int | None = None
    ratio: float | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", Scheme(self.scheme))
        object.__setattr__(self, "heads", tuple(int(h) for h in self.heads))
        object.__setattr__(self, "head_dims", tuple(int(d) for d in self.head_dims))
        object.__setattr__(self, "notes", tuple(self.notes))

    @classmethod
    def explicit(cls, heads: Sequence[int], head_dims: Sequence[int] = ()) -> "Plan":
        """The plan of a model whose heads were given per layer."""
        return cls(Scheme.EXPLICIT, tuple(heads), tuple(head_dims))

    @property
    def total(self) -> int:
        """Heads over all layers."""
        return sum(self.heads)

    @property
    def n_layers(self) -> int:
        return len(self.heads)

    @property
    def exact(self) -> bool:
        """True when the plan meets the requested budget (or none was requested)."""
        return self.requested_total is None or self.total == self.requested_total

    @property
    def widths(self) -> tuple[int, ...]:
        """Attention width per layer (heads x head_dim); empty without head widths."""
        return tuple(h * d for h, d in zip(self.heads, self.head_dims))

    def with_head_dims(self, head_dims: Sequence[int]) -> "Plan":
        """The same plan with its per-layer head widths filled in."""
        if len(head_dims) != len(self.heads):
            raise ValueError(f"{len(head_dims)} head widths for a plan of {len(self.heads)} layers")
        return dataclasses.replace(self, head_dims=tuple(head_dims))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back); ``total`` is included for readers."""
        return {"scheme": self.scheme.value, "heads": list(self.heads), "head_dims": list(self.head_dims),
                "total": self.total, "requested_total": self.requested_total, "ratio": self.ratio,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """Inverse of :meth:`to_dict` (the derived ``total`` is ignored)."""
        return cls(scheme=Scheme(data["scheme"]), heads=tuple(data["heads"]),
                   head_dims=tuple(data.get("head_dims") or ()), requested_total=data.get("requested_total"),
                   ratio=data.get("ratio"), notes=tuple(data.get("notes") or ()))


def valid_counts(d_model: int, tied: bool, limit: int) -> list[int]:
    """Head counts allowed in one layer: divisors of d_model when head_dim is tied to it,
    else every count up to ``limit``."""
    return divisors(d_model) if tied else list(range(1, limit + 1))


def _nearest(valid: Sequence[int], x: float) -> int:
    """The valid count nearest to x (the smaller on a tie); ``valid`` is sorted."""
    i = bisect.bisect_left(valid, x)
    near = valid[max(i - 1, 0): i + 1]
    return min(near, key=lambda v: (abs(v - x), v))


def _shape(scheme: Scheme, n_layers: int, ratio: float) -> list[float]:
    """Relative sizes of the layers for a scheme, the smallest entry being 1."""
    if scheme is Scheme.CONSTANT:
        return [1.0] * n_layers
    if scheme is Scheme.ASCENDING:
        return [ratio**i for i in range(n_layers)]
    if scheme is Scheme.DESCENDING:
        return [ratio ** (n_layers - 1 - i) for i in range(n_layers)]
    # linear: from 1 to ratio in equal steps (ratio < 1 ramps down; rescaled so min is 1)
    steps = [1.0 + (ratio - 1.0) * i / max(n_layers - 1, 1) for i in range(n_layers)]
    low = min(steps)
    return [s / low for s in steps]


def plan_heads(
    scheme: Scheme | str,
    n_layers: int,
    d_model: int,
    total_heads: int | None = None,
    *,
    ratio: float = 2.0,
    heads: Sequence[int] | None = None,
    head_dim: int | None = None,
) -> Plan:
    """Choose per-layer head counts.

    Args:
        scheme: a :class:`Scheme` or its name.
        n_layers, d_model: the model's depth and width.
        total_heads: the budget (required unless ``scheme == "explicit"``).
        ratio: growth per layer for ascending/descending, last/first for linear.
        heads: the counts for ``scheme == "explicit"``.
        head_dim: a fixed head width decoupled from d_model (then any count >= 1 is valid);
            None ties head_dim to d_model / heads.

    The plan's head widths are filled in: ``head_dim``, or ``d_model // heads`` when tied.
    """
    if n_layers < 1:
        raise HeadwiseError(f"n_layers = {n_layers}; a model needs at least 1 layer")
    if d_model < 1:
        raise HeadwiseError(f"d_model = {d_model}; it must be a positive integer")
    if scheme not in SCHEMES:
        raise HeadwiseError(f"unknown scheme {str(scheme)!r}; valid schemes: {', '.join(SCHEMES)}")
    scheme = Scheme(scheme)
    tied = head_dim is None
    if head_dim is not None and head_dim < 1:
        raise HeadwiseError(f"head_dim = {head_dim}; it must be a positive integer")

    def widths(heads: Sequence[int]) -> tuple[int, ...]:
        return tuple(d_model // h if tied else head_dim for h in heads)  # type: ignore[misc]

    if scheme is Scheme.EXPLICIT:
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
        return Plan(scheme, tuple(heads), widths(heads), requested_total=total_heads)
    if total_heads is None:
        raise HeadwiseError(f"scheme {scheme.value!r} needs total_heads, the budget of heads over all layers "
                            f"(at least {n_layers}, one head per layer)")
    if total_heads < n_layers:
        raise HeadwiseError(
            f"total_heads = {total_heads}; scheme {scheme.value!r} needs a budget of at least {n_layers} (one head per layer)"
        )
    if ratio <= 0 or (scheme in (Scheme.ASCENDING, Scheme.DESCENDING) and ratio < 1):
        raise HeadwiseError(f"ratio = {ratio}; use a ratio >= 1 (the scheme sets the direction)")
    valid = valid_counts(d_model, tied, limit=total_heads)
    shape = _shape(scheme, n_layers, ratio)
    # Every candidate plan is the shape scaled by a base size, each layer snapped to a valid
    # count; the base runs in steps of 1/16 up to the largest valid count, which reaches every
    # plan the snapping can produce for ratios used in practice.
    bases = (k / 16 for k in range(16, 16 * valid[-1] + 1))
    candidates = {tuple(_nearest(valid, base * s) for s in shape) for base in bases}
    best = min(candidates, key=lambda c: (abs(sum(c) - total_heads), sum(c)))
    notes: tuple[str, ...] = ()
    if sum(best) != total_heads:
        why = f"divisors of d_model {d_model}" if tied else "positive integers"
        notes = (f"no {scheme.value} plan of valid counts ({why}) totals exactly {total_heads} heads; "
                 f"nearest is {sum(best)}",)
    return Plan(scheme, best, widths(best), requested_total=total_heads, ratio=ratio, notes=notes)
