"""A search's budget: what a plan may cost, computed exactly from its ModelSpec, never by building
the model.

    [budget]
    metric = "total_heads"     # "params", "flops_per_token", "kv_bytes_per_token" or "total_heads"
    target = 180               # exactly this; or a cap `max = ...` and/or a floor `min = ...`
    # dtype = "fp32"           # kv_bytes_per_token: the cache's element type (fp32, bf16, fp16)

Every budget is a sum over the layers plus a constant, seen through a non-decreasing map, which is
what lets the search's space (:mod:`headwise.search.space`) keep only plans that can still meet it:

- ``params``: :func:`headwise.params.count_params`: the front end, the final norm and the output
  head (the constant) plus each block's :func:`~headwise.params.block_params`;
- ``flops_per_token``: :func:`headwise.params.flops_per_token`: per sequence of T positions,
  6 T x (the constant's weights less the positions' + each block's) + each layer's attention
  products, then scaled to one token and rounded (the map);
- ``kv_bytes_per_token``: :func:`headwise.params.kv_cache_bytes_per_token`: 2 x KV heads x
  head_dim x bytes per layer (nothing for a bidirectional model);
- ``total_heads``: the heads of each layer.

Throughput (tokens/s) is measured by training, not computed from a plan, so it is no budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

from pydantic import model_validator

from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.params import KV_DTYPE_BYTES, attention_flops, block_params, count_params
from headwise.parts import FRONT_END_PARTS, position_params
from headwise.spec import ModelSpec

#: the budgets a plan determines, in the order records list them (:func:`headwise.params.plan_budget`'s)
METRICS = ("params", "flops_per_token", "kv_bytes_per_token", "total_heads")
#: names a budget cannot take (measured by training a model, not computed from its plan), as messages say them
MEASURED = {"tokens_per_s": "tokens/s", "tokens/s": "tokens/s", "throughput": "throughput", "peak_memory": "peak memory"}


class BudgetConfig(Config):
    """``[budget]``: one computed metric of the plan and the bounds it must keep."""

    metric: str
    #: a cap: the metric at most this
    max: int | None = None
    #: a floor: the metric at least this
    min: int | None = None
    #: exactly this (not with min or max)
    target: int | None = None
    #: kv_bytes_per_token: the cache's element type
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"

    @model_validator(mode="after")
    def _check(self) -> "BudgetConfig":
        if self.metric in MEASURED:
            raise ValueError(f"budget metric {self.metric!r}: {MEASURED[self.metric]} is measured by training a "
                             f"model, not computed from its plan; budget one of {', '.join(METRICS)}")
        if self.metric not in METRICS:
            raise ValueError(f"unknown budget metric {self.metric!r}; one of {', '.join(METRICS)}")
        if self.target is not None and (self.max is not None or self.min is not None):
            raise ValueError("give the budget a target, or min and/or max, not both")
        if self.target is None and self.max is None and self.min is None:
            raise ValueError(f"budget on {self.metric}: give max (a cap), min (a floor) or target (exactly)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"budget on {self.metric}: min {self.min} is above max {self.max}")
        return self

    @property
    def low(self) -> int | None:
        """The smallest value allowed (None: no floor)."""
        return self.target if self.target is not None else self.min

    @property
    def high(self) -> int | None:
        """The largest value allowed (None: no cap)."""
        return self.target if self.target is not None else self.max

    def allows(self, value: int) -> bool:
        """True when ``value`` of the metric keeps the budget."""
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self) -> str:
        """``total_heads = 180``, ``params <= 700000``, ``100 <= params <= 200``."""
        if self.target is not None:
            return f"{self.metric} = {self.target}"
        if self.min is not None and self.max is not None:
            return f"{self.min} <= {self.metric} <= {self.max}"
        return f"{self.metric} <= {self.max}" if self.max is not None else f"{self.metric} >= {self.min}"


@dataclass(frozen=True)
class CostModel:
    """One metric as ``value(constant + sum of layer costs)``, for the models of one base spec
    (its front end, head, norms and task length, which no layer changes)."""

    metric: str
    base: ModelSpec
    seq_len: int
    dtype: str = "fp32"

    @property
    def _positions(self) -> int:
        return FRONT_END_PARTS[self.base.inputs].positions(self.base, self.seq_len)

    def constant(self) -> int:
        """What every plan pays whatever its layers, in the metric's raw units."""
        if self.metric in ("kv_bytes_per_token", "total_heads"):
            return 0
        fixed = count_params(self.base) - sum(block_params(self.base, i) for i in range(self.base.n_layers))
        if self.metric == "params":
            return fixed
        # flops_per_token counts every matmul weight: the learned positions are looked up, not multiplied
        return 6 * self._positions * (fixed - position_params(self.base))

    def layer_cost(self, spec: ModelSpec, i: int) -> int:
        """Layer ``i`` of ``spec`` (a spec of this base with other layers) in raw units."""
        shape = spec.layer(i)
        if self.metric == "total_heads":
            return shape.heads
        if self.metric == "kv_bytes_per_token":
            return 2 * shape.kv_heads * shape.head_dim * KV_DTYPE_BYTES[self.dtype] if spec.causal else 0
        params = block_params(spec, i)
        if self.metric == "params":
            return params
        t = self._positions
        return _exact(6 * t * params + attention_flops(spec, shape, t))

    def value(self, raw: int) -> int:
        """The metric of a plan whose raw cost (constant and layers) is ``raw``; non-decreasing."""
        if self.metric != "flops_per_token":
            return raw
        # as flops_per_token rounds it: per sequence, then per unit of the task's examples
        return round(raw * FRONT_END_PARTS[self.base.inputs].sequences_per_example / self.seq_len)


def _exact(x: float) -> int:
    """A count the attention kinds give as a float: every built-in one is a whole number, which
    sums exactly as an int; anything else would make a budget inexact, so it is refused."""
    if float(x).is_integer():
        return int(x)
    raise ValueError(f"an attention kind counts {x} FLOPs, not a whole number: the budget cannot be exact")


#: ``--to KIND:AMOUNT``: each kind's budget metric, as ``headwise search`` names and counts it
#: (this module's); an amount alone is parameters
BUDGET_KINDS = {"heads": "total_heads", "params": "params", "flops": "flops_per_token",
                "kv-bytes": "kv_bytes_per_token"}
#: an amount's suffixes: thousands, millions, billions
SCALE = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}


def parse_budget(text: str) -> BudgetConfig:
    """A cap as ``headwise heads prune --to`` and ``[train.prune] to`` give it, as a budget as a search's ``[budget]`` with that cap: ``KIND:AMOUNT`` (a kind of
    :data:`BUDGET_KINDS`) or an amount of parameters, the amount a whole number that may end in
    one of :data:`SCALE` (``params:1.2M`` is 1,200,000)."""
    kind, sep, amount = text.strip().rpartition(":")
    kind = kind if sep else "params"
    if kind not in BUDGET_KINDS:
        raise HeadwiseError(f"--to {text}: unknown budget {kind!r}; give {', '.join(f'{k}:N' for k in BUDGET_KINDS)} "
                            "(N alone: parameters)")
    scale = SCALE.get(amount[-1:], 1)
    try:
        value = Decimal(amount[:-1] if amount[-1:] in SCALE else amount) * scale
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value != value.to_integral_value() or value < 1:
        raise HeadwiseError(f"--to {text}: {amount!r} is not a whole number of at least 1 (e.g. {kind}:24, "
                            f"{kind}:1.2M)")
    return BudgetConfig(metric=BUDGET_KINDS[kind], max=int(value))
