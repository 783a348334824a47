"""Head plans: turn a scheme and a budget of heads into per-layer head counts.

Schemes
  constant    the same count in every layer
  ascending   geometric growth through the layers, ``ratio`` (default 2) per layer
  descending  geometric decay through the layers
  linear      an arithmetic ramp from the first layer's count to ``ratio`` times it
              (ratio < 1 ramps down)
  explicit    a given list, only validated
  layerwise   OpenELM's layer-wise scaling (:func:`layerwise_scaling`): query heads, key/value
              heads and MLP widths linear in the layer index, rounded as OpenELM rounds; it needs
              a fixed ``head_dim`` and takes no budget

Key/value heads (grouped-query attention) get a plan of their own over the query plan
(:func:`plan_kv_heads`): the same query heads per KV head in every layer (``kv_group``), or one of
the schemes above with a budget of KV heads, each layer's count a divisor of its query heads.

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

import numpy as np

from headwise.errors import HeadwiseError
from headwise.layer_shape import LayerShape, divisors


class Scheme(str, Enum):
    """How heads are spread over the layers."""

    CONSTANT = "constant"
    ASCENDING = "ascending"
    DESCENDING = "descending"
    LINEAR = "linear"
    EXPLICIT = "explicit"
    LAYERWISE = "layerwise"

    def __str__(self) -> str:
        return self.value


SCHEMES: tuple[str, ...] = tuple(s.value for s in Scheme)

#: the largest budget of heads a scheme spreads (the largest public models have about 16k heads in
#: all); the nearest-plan search's cost grows with the budget when head widths are free
MAX_TOTAL_HEADS = 32768


@dataclass(frozen=True)
class Plan:
    """A head plan, resolved: what was asked (scheme, budget, ratio), the layers that came out
    (:class:`~headwise.layer_shape.LayerShape`: heads, and head widths, key/value heads and MLP
    widths where the plan sets them), and notes when the budget could not be met exactly.

    It is made once, by :func:`plan_heads` (or :meth:`explicit` for layers given one by one), and
    carried as it is through the run config, the run summary, a study's results and its report;
    :meth:`headwise.spec.ModelSpec.with_layers` applies its layers to a spec.
    """

    scheme: Scheme
    layers: tuple[LayerShape, ...]
    requested_total: int | None = None
    ratio: float | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", Scheme(self.scheme))
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "notes", tuple(self.notes))

    @classmethod
    def of(cls, scheme: Scheme | str, heads: Sequence[int], head_dims: Sequence[int] = (),
           kv_heads: Sequence[int] = (), mlp_hidden: Sequence[int] = (), **meta: Any) -> "Plan":
        """The plan of per-layer lists (each of ``head_dims``, ``kv_heads``, ``mlp_hidden`` empty
        when the plan does not set it), with ``meta`` (``requested_total``, ``ratio``, ``notes``)."""
        n = len(heads)
        columns = {}
        for name, values in (("head_dim", head_dims), ("kv_heads", kv_heads), ("mlp_hidden", mlp_hidden)):
            if values and len(values) != n:
                raise ValueError(f"{len(values)} values of {name} for a plan of {n} layers")
            columns[name] = [int(v) for v in values] or [None] * n
        layers = tuple(LayerShape(int(h), head_dim=d, kv_heads=k, mlp_hidden=m)
                       for h, d, k, m in zip(heads, columns["head_dim"], columns["kv_heads"], columns["mlp_hidden"]))
        return cls(Scheme(scheme), layers, **meta)

    @classmethod
    def explicit(cls, heads: Sequence[int], head_dims: Sequence[int] = ()) -> "Plan":
        """The plan of a model whose heads (and head widths) were given per layer."""
        return cls.of(Scheme.EXPLICIT, heads, head_dims)

    def _column(self, name: str) -> tuple[int, ...]:
        """One field over the layers; empty when the plan does not set it."""
        values = tuple(getattr(s, name) for s in self.layers)
        return () if None in values else values

    @property
    def heads(self) -> tuple[int, ...]:
        """Query heads per layer."""
        return tuple(s.heads for s in self.layers)

    @property
    def head_dims(self) -> tuple[int, ...]:
        """Head widths per layer; empty when the plan was made without them (:meth:`with_head_dims`)."""
        return self._column("head_dim")

    @property
    def kv_heads(self) -> tuple[int, ...]:
        """Key/value heads per layer, when the plan sets them (``layerwise``, a key/value plan); else empty."""
        return self._column("kv_heads")

    @property
    def mlp_hidden(self) -> tuple[int, ...]:
        """MLP widths per layer, when the scheme sets them (``layerwise``); else empty."""
        return self._column("mlp_hidden")

    @property
    def total(self) -> int:
        """Heads over all layers."""
        return sum(self.heads)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def exact(self) -> bool:
        """True when the plan meets the requested budget (or none was requested)."""
        return self.requested_total is None or self.total == self.requested_total

    @property
    def widths(self) -> tuple[int, ...]:
        """Attention width per layer (heads x head_dim); empty without head widths."""
        return tuple(s.width for s in self.layers) if self.head_dims else ()

    def with_head_dims(self, head_dims: Sequence[int]) -> "Plan":
        """The same plan with its per-layer head widths filled in."""
        return self._with("head_dim", head_dims)

    def with_kv_heads(self, kv_heads: Sequence[int], notes: Sequence[str] = ()) -> "Plan":
        """The same plan with per-layer key/value heads (and what their plan noted)."""
        return dataclasses.replace(self._with("kv_heads", kv_heads), notes=self.notes + tuple(notes))

    def _with(self, name: str, values: Sequence[int]) -> "Plan":
        if len(values) != len(self.layers):
            raise ValueError(f"{len(values)} values of {name} for a plan of {len(self.layers)} layers")
        layers = tuple(dataclasses.replace(s, **{name: int(v)}) for s, v in zip(self.layers, values))
        return dataclasses.replace(self, layers=layers)

    def describe(self) -> str:
        """``4 layers: heads 96,48,24,12`` (+ head widths where they are not d_model / heads, KV
        heads where there are fewer than heads, MLP widths where they differ between layers)."""
        text = f"{self.n_layers} layers: heads {','.join(map(str, self.heads))}"
        shown = (("head_dim", self.head_dims, len(set(self.widths)) > 1 and len(set(self.head_dims)) > 1),
                 ("kv_heads", self.kv_heads, bool(self.kv_heads) and self.kv_heads != self.heads),
                 ("mlp", self.mlp_hidden, len(set(self.mlp_hidden)) > 1))
        for name, values, differ in shown:
            if differ:
                text += f", {name} {','.join(map(str, values))}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back); ``total`` is included for readers.
        ``kv_heads`` and ``mlp_hidden`` appear only when the plan sets them."""
        extra = {name: list(getattr(self, name)) for name in ("kv_heads", "mlp_hidden") if getattr(self, name)}
        return {"scheme": self.scheme.value, "heads": list(self.heads), "head_dims": list(self.head_dims),
                "total": self.total, "requested_total": self.requested_total, "ratio": self.ratio,
                "notes": list(self.notes), **extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """Inverse of :meth:`to_dict` (the derived ``total`` is ignored)."""
        return cls.of(data["scheme"], data["heads"], data.get("head_dims") or (), data.get("kv_heads") or (),
                      data.get("mlp_hidden") or (), requested_total=data.get("requested_total"),
                      ratio=data.get("ratio"), notes=tuple(data.get("notes") or ()))


def valid_counts(d_model: int, tied: bool, limit: int) -> list[int]:
    """Head counts allowed in one layer: divisors of d_model when head_dim is tied to it,
    else every count up to ``limit``."""
    return divisors(d_model) if tied else list(range(1, limit + 1))


def nearest_count(valid: Sequence[int], x: float) -> int:
    """The valid count nearest to x (the smaller on a tie); ``valid`` is sorted."""
    i = bisect.bisect_left(valid, x)
    near = valid[max(i - 1, 0): i + 1]
    return min(near, key=lambda v: (abs(v - x), v))


def scheme_shape(scheme: Scheme, n_layers: int, ratio: float) -> list[float]:
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


def make_divisible(v: float, divisor: int) -> int:
    """``v`` rounded to the nearest multiple of ``divisor`` (at least ``divisor``; half rounds up),
    one multiple higher when that rounding lost more than 10% of ``v``: the MobileNet rounding
    OpenELM uses for its layers' widths (``corenet.utils.math_utils.make_divisible``)."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def ramp(first: float, last: float, n_layers: int) -> list[float]:
    """``n_layers`` evenly spaced values from ``first`` to ``last``, each rounded to 2 decimals by
    OpenELM's own operations: ``round(v, 2)`` of numpy's ``linspace`` values. A numpy float rounds
    ``v * 100`` half to even, not ``v``'s decimal value as Python does: 0.925 becomes 0.92, not 0.93."""
    return [float(round(v, 2)) for v in np.linspace(first, last, num=n_layers, dtype=float)]


@dataclass(frozen=True)
class LayerwiseShape:
    """Per-layer query heads, key/value heads and MLP widths (``mlp_hidden``: the SwiGLU's value
    and gate halves together, twice OpenELM's ``intermediate_dim``) of a layer-wise scaled model."""

    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    mlp_hidden: tuple[int, ...]


def layerwise_scaling(n_layers: int, d_model: int, head_dim: int, *,
                      qkv_multipliers: tuple[float, float] = (0.5, 1.0),
                      ffn_multipliers: tuple[float, float] = (0.5, 4.0),
                      gqa_groups: int = 4, ffn_divisor: int = 256) -> LayerwiseShape:
    """OpenELM's layer-wise scaling (Mehta et al. 2024, "OpenELM", section 2; corenet's
    ``GPTConfig.__post_init__`` and ``FeedForwardNetwork``), with its defaults (OpenELM-270M to 3B).

    Layer i's multipliers are linear in i from the first to the last value, rounded to 2 decimals.
    Its query width ``d_model * qkv_multiplier`` is rounded by :func:`make_divisible` to a multiple
    of ``head_dim * gqa_groups``, giving ``heads = width / head_dim`` query heads and ``heads /
    gqa_groups`` key/value heads; its SwiGLU inner width ``d_model * ffn_multiplier`` is rounded
    by :func:`make_divisible` to a multiple of ``ffn_divisor``.
    """
    for name, value in (("n_layers", n_layers), ("d_model", d_model), ("head_dim", head_dim),
                        ("gqa_groups", gqa_groups), ("ffn_divisor", ffn_divisor)):
        if value < 1:
            raise HeadwiseError(f"layerwise scaling: {name} = {value}; it must be a positive integer")
    for name, pair in (("qkv_multipliers", qkv_multipliers), ("ffn_multipliers", ffn_multipliers)):
        if len(pair) != 2 or min(pair) <= 0:
            raise HeadwiseError(f"layerwise scaling: {name} = {list(pair)}; give two positive numbers, "
                                "the first layer's and the last layer's")
    heads = tuple(make_divisible(d_model * m, head_dim * gqa_groups) // head_dim
                  for m in ramp(*qkv_multipliers, n_layers))
    ffn = tuple(2 * make_divisible(d_model * m, ffn_divisor) for m in ramp(*ffn_multipliers, n_layers))
    return LayerwiseShape(heads, tuple(h // gqa_groups for h in heads), ffn)


def plan_heads(
    scheme: Scheme | str,
    n_layers: int,
    d_model: int,
    total_heads: int | None = None,
    *,
    ratio: float = 2.0,
    heads: Sequence[int] | None = None,
    head_dim: int | None = None,
    layerwise: dict[str, Any] | None = None,
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
        layerwise: for ``scheme == "layerwise"``, keyword arguments of :func:`layerwise_scaling`
            (its multipliers, ``gqa_groups``, ``ffn_divisor``); the plan then carries the
            key/value heads and MLP widths too.

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

    if scheme is Scheme.LAYERWISE:
        if head_dim is None:
            raise HeadwiseError("scheme 'layerwise' needs a fixed head_dim (e.g. --head-dim 64): OpenELM scales "
                                "the number of heads, not their width")
        if total_heads is not None:
            raise HeadwiseError("scheme 'layerwise' takes no budget of heads: its multipliers set the heads")
        shape = layerwise_scaling(n_layers, d_model, head_dim, **(layerwise or {}))
        return Plan.of(scheme, shape.heads, widths(shape.heads), shape.kv_heads, shape.mlp_hidden)
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
        return Plan.of(scheme, heads, widths(heads), requested_total=total_heads)
    if total_heads is None:
        raise HeadwiseError(f"scheme {scheme.value!r} needs total_heads, the budget of heads over all layers "
                            f"(at least {n_layers}, one head per layer)")
    if total_heads < n_layers:
        raise HeadwiseError(
            f"total_heads = {total_heads}; scheme {scheme.value!r} needs a budget of at least {n_layers} (one head per layer)"
        )
    if total_heads > MAX_TOTAL_HEADS:
        raise HeadwiseError(f"total_heads = {total_heads:,}; a scheme spreads at most {MAX_TOTAL_HEADS:,} heads "
                            "(give the counts themselves with scheme 'explicit')")
    if ratio <= 0 or (scheme in (Scheme.ASCENDING, Scheme.DESCENDING) and ratio < 1):
        raise HeadwiseError(f"ratio = {ratio}; use a ratio >= 1 (the scheme sets the direction)")
    valid = valid_counts(d_model, tied, limit=total_heads)
    shape = scheme_shape(scheme, n_layers, ratio)
    # Every candidate plan is the shape scaled by a base size, each layer snapped to a valid
    # count; the base runs in steps of 1/16 up to the largest valid count, which reaches every
    # plan the snapping can produce for ratios used in practice.
    bases = (k / 16 for k in range(16, 16 * valid[-1] + 1))
    candidates = {tuple(nearest_count(valid, base * s) for s in shape) for base in bases}
    best = min(candidates, key=lambda c: (abs(sum(c) - total_heads), sum(c)))
    notes: tuple[str, ...] = ()
    if sum(best) != total_heads:
        why = f"divisors of d_model {d_model}" if tied else "positive integers"
        notes = (f"no {scheme.value} plan of valid counts ({why}) totals exactly {total_heads} heads; "
                 f"nearest is {sum(best)}",)
    return Plan.of(scheme, best, widths(best), requested_total=total_heads, ratio=ratio, notes=notes)


def plan_kv_heads(heads: Sequence[int], *, group: int | None = None, scheme: Scheme | str | None = None,
                  total: int | None = None, ratio: float = 2.0) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Key/value heads per layer for the query heads ``heads``, and the notes of the plan.

    ``group``: every layer shares each KV head among ``group`` query heads (Llama's GQA; 1 is
    multi-head attention), so every layer's heads must be a multiple of it. Else ``scheme``
    (constant, ascending, descending or linear, with ``ratio`` as for query heads) spreads a
    budget of ``total`` KV heads over the layers, each layer's count snapped to a divisor of its
    query heads; when no such plan totals exactly ``total``, the nearest does (fewer on a tie), and
    a note says so.
    """
    heads = [int(h) for h in heads]
    if (group is None) == (scheme is None):
        raise HeadwiseError("a key/value plan takes kv_group (query heads per KV head) or kv_scheme with "
                            "kv_total_heads, one of the two")
    if group is not None:
        if group < 1:
            raise HeadwiseError(f"kv_group = {group}; it must be a positive integer")
        for i, h in enumerate(heads):
            if h % group:
                raise HeadwiseError(f"layer {i}: {h} query heads are not a multiple of kv_group {group}; each key/"
                                    f"value head serves kv_group query heads: choose a kv_group dividing every "
                                    f"layer's heads ({', '.join(map(str, _common_divisors(heads)))})")
        return tuple(h // group for h in heads), ()
    if scheme not in SCHEMES or Scheme(scheme) in (Scheme.EXPLICIT, Scheme.LAYERWISE):
        raise HeadwiseError(f"kv_scheme {str(scheme)!r}: use constant, ascending, descending or linear (per-layer "
                            "counts are model.kv_heads)")
    scheme = Scheme(scheme)
    if total is None or not len(heads) <= total <= sum(heads):
        raise HeadwiseError(f"kv_scheme {scheme.value!r} needs kv_total_heads between {len(heads)} (one per layer) "
                            f"and {sum(heads)} (as many as the query heads), not {total}")
    if ratio <= 0 or (scheme in (Scheme.ASCENDING, Scheme.DESCENDING) and ratio < 1):
        raise HeadwiseError(f"kv_ratio = {ratio}; use a ratio >= 1 (the scheme sets the direction)")
    valid = [divisors(h) for h in heads]
    shape = scheme_shape(scheme, len(heads), ratio)
    # as for query heads: the shape scaled by a base in steps of 1/16, each layer snapped to a
    # divisor of its own query heads
    bases = (k / 16 for k in range(16, 16 * max(heads) + 1))
    candidates = {tuple(nearest_count(v, base * f) for v, f in zip(valid, shape)) for base in bases}
    best = min(candidates, key=lambda c: (abs(sum(c) - total), sum(c)))
    notes: tuple[str, ...] = ()
    if sum(best) != total:
        notes = (f"no {scheme.value} plan of key/value heads dividing each layer's query heads totals exactly "
                 f"{total}; nearest is {sum(best)}",)
    return best, notes


def _common_divisors(heads: Sequence[int]) -> list[int]:
    """The counts that divide every one of ``heads``."""
    return [d for d in divisors(min(heads)) if all(h % d == 0 for h in heads)]
