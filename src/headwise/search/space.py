"""A search's space, feasible by construction: the optimiser's values in, a plan that meets the budget out.

    [space]
    depth = [2, 8]              # layers: one count, or [min, max] (default: the base's n_layers)
    heads = "divisors"          # per layer: the divisors of d_model, or a list of counts
    head_dim = "tied"           # "tied" (d_model / heads), one width, or a list (default: the base's)
    kv_heads = "divisors"       # per layer: divisors of its heads, or a list (default: the base's)
    mlp_ratio = [2.0, 4.0]      # per layer: MLP widths as multiples of d_model (default: the base's)
    lr = [1e-3, 1e-2]           # optim.lr of each trial, drawn with the plan (default: the base's)

The optimiser draws one parameter for the depth (``depth``, when it varies) and for each varying
choice of each layer (``layer{i}.heads``, ``layer{i}.head_dim``, ``layer{i}.kv_heads``,
``layer{i}.mlp_ratio``), each over the same range in every trial (:meth:`PlanSpace.choices`:
every value the space offers it, before the budget), so a parameter's value is the layer's head
count (width, KV heads, MLP ratio) itself. :meth:`PlanSpace.decode` takes them in order and
*repairs* each: a value that leaves no completion within the budget becomes the nearest value
that does (:func:`nearest`: on a log scale, the depth's on a linear one; the smaller on a tie).
That is decided exactly, because every budget is a constant plus per-layer costs through a
non-decreasing map (:mod:`headwise.budget`): the layer options' costs are computed once,
and for the layers still to choose the search keeps the smallest and largest sum they can add (a
budget with only a cap or only a floor) or every sum they can add (a target, or a floor and a cap
together). So every decoded plan keeps the budget, every plan that keeps it is reachable (its own
values, :meth:`PlanSpace.encode`), and a space with no such plan is refused before any trial. The
search's sampler repairs each value as it draws it (:meth:`PlanSpace.repair`), so the values
Optuna stores are the plan's.

A plan is a :class:`~headwise.plans.Plan` whose layers have every field resolved (what the space
chose, and what each layer takes from the base), so the base's spec with its layers
(:meth:`~headwise.spec.ModelSpec.with_layers`) is the trial's model.

With ``scaling = "linear"`` or ``"geometric"`` the space is a few numbers instead of one choice
per layer (:mod:`headwise.search.scaled`); both share :class:`PlanSpace`.
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from headwise.errors import HeadwiseError
from headwise.layer_shape import LayerShape, divisors
from headwise.plans import Plan, Scheme
from headwise.budget import BudgetConfig, CostModel
from headwise.spec import DEFAULT_KIND, ModelSpec

#: the choices of one layer, in the order they are drawn, as their parameters name them, each with
#: the :class:`~headwise.layer_shape.LayerShape` field it sets (an MLP ratio sets the layer's width:
#: ratios that round to one width are one choice, so widths keep the ratios' order)
FIELDS = {"heads": "heads", "head_dim": "head_dim", "kv_heads": "kv_heads", "mlp_ratio": "mlp_hidden"}
DIMS = tuple(FIELDS)
#: reachable sums kept for the layers still to choose, over every depth, before a space is too
#: large to check exactly
MAX_SUMS = 2_000_000


@dataclass(frozen=True)
class LayerOption:
    """One choice a layer may take (every field resolved), with its cost in the budget's raw units."""

    choice: LayerShape
    cost: int


def on_log_scale(name: str) -> bool:
    """Whether parameter ``name`` is drawn on a log scale: every count, width and ratio is, the depth
    is not."""
    return name != "depth"


def nearest(values: list[Any], x: Any, log: bool) -> Any:
    """The value of the sorted ``values`` nearest ``x`` (on a log scale when ``log``; the smaller on
    a tie)."""
    return min(values, key=(lambda v: abs(math.log(v / x))) if log else (lambda v: abs(v - x)))


class PlanSpace(ABC):
    """What every search space shares: each layer's options for a base model and their costs,
    the depths, and the run config of a plan. :class:`Space` chooses every layer's option;
    :class:`~headwise.search.scaled.ScaledSpace` sets them all from a few numbers.

    ``base`` is the base model's spec; ``cost`` the budget's :class:`CostModel` (the params
    metric without a budget). A space none of whose depths has an option in every layer is
    refused (one line)."""

    #: the depths that hold a plan within the budget (set by each space)
    feasible_depths: list[int]

    # ---- what each space answers: the same questions, with the same meaning ---------------

    @abstractmethod
    def _walk(self, choose: Callable[[str, list[Any]], Any]) -> Plan:
        """The plan made by ``choose(parameter name, sorted values still leading to a plan)``."""

    @abstractmethod
    def choices(self, name: str) -> list[Any]:
        """Every value parameter ``name`` may take, sorted, the same in every trial (before the budget)."""

    def decode(self, draw: Callable[[str], Any]) -> Plan:
        """The plan of the values ``draw(name)`` gives (each in the range of :meth:`choices`), each
        repaired in turn to the nearest value that still leads to a plan: always within budget."""
        return self._walk(lambda name, values: nearest(values, draw(name), on_log_scale(name)))

    def repair(self, params: dict[str, Any], name: str, value: Any) -> Any:
        """``value`` of parameter ``name``, repaired as :meth:`decode` repairs it after the values
        ``params`` of the parameters drawn before it; a name the plan does not draw (``optim.lr``)
        keeps its value."""
        chosen: dict[str, Any] = {}

        def choose(n: str, values: list[Any]) -> Any:
            # the parameters after `name` are not drawn yet: any value completes the walk
            chosen[n] = nearest(values, value if n == name else params.get(n, values[0]), on_log_scale(n))
            return chosen[n]

        self._walk(choose)
        return chosen.get(name, value)

    @abstractmethod
    def encode(self, plan: Plan) -> dict[str, Any]:
        """The values :meth:`decode` maps to ``plan`` (its own); a HeadwiseError (saying why) when
        the plan is not in the space or misses the budget."""

    @abstractmethod
    def plans(self, limit: int | None = None) -> Iterator[Plan]:
        """Every feasible plan, once each; at most ``limit``."""

    @abstractmethod
    def count(self, limit: int = 1_000_000) -> int | None:
        """How many feasible plans there are (None: too many to count)."""

    @abstractmethod
    def _draws(self) -> str:
        """How the optimiser's values set a plan (e.g. "a choice per layer (heads)")."""

    def parametrisation(self) -> str:
        """What the optimiser draws for a trial, for ``--dry-run``: the plan's values, and the
        learning rate where the space searches it."""
        lr = self.config.lr
        return self._draws() + (f"; optim.lr from {lr[0]:g} to {lr[1]:g} (log scale)" if lr else "")

    @abstractmethod
    def size(self) -> int:
        """How many plans the space holds before the budget."""

    def __init__(self, config: Any, base: ModelSpec, budget: BudgetConfig | None, seq_len: int) -> None:
        self.config, self.base, self.budget, self.seq_len = config, base, budget, seq_len
        metric = budget.metric if budget is not None else "params"
        self.cost = CostModel(metric, base, seq_len, budget.dtype if budget is not None else "fp32")
        self.constant = self.cost.constant()
        self.depths = self._depths()
        #: which of a layer's choices the space offers more than one value of
        self.varies = {"heads": len(self._heads()) > 1,
                       "head_dim": isinstance(config.head_dim, list) and len(config.head_dim) > 1,
                       "kv_heads": config.kv_heads == "divisors" or isinstance(config.kv_heads, list)
                       and len(config.kv_heads) > 1,
                       "mlp_ratio": config.mlp_ratio is not None and len(config.mlp_ratio) > 1}
        self._options: dict[tuple[Any, ...], list[LayerOption]] = {}
        # a plan's run config sets what the base does not already say for every layer
        self.sets_head_dim = config.head_dim not in (None, "tied") or config.head_dim == "tied" and base.head_dim is not None
        self.sets_kv_heads = config.kv_heads is not None
        self.sets_mlp = config.mlp_ratio is not None
        #: the MLP widths the space offers, widest first, each with the smallest ratio that rounds to it
        self.mlp_ratios = {int(round(r * base.d_model)): r for r in sorted(set(config.mlp_ratio or []), reverse=True)}
        empty = [d for d in self.depths if not all(self._options_at(d, i) for i in range(d))]
        if len(empty) == len(self.depths):
            raise HeadwiseError(f"[space] allows no layer: {self._why_no_option()}")

    # ---- what a layer may be ---------------------------------------------------------------

    def _depths(self) -> list[int]:
        depth = self.config.depth
        if depth is None:
            return [self.base.n_layers]
        if isinstance(depth, int):
            return [depth]
        return list(range(depth[0], depth[1] + 1))

    def _heads(self) -> list[int]:
        heads = self.config.heads
        return divisors(self.base.d_model) if heads == "divisors" else sorted(set(heads))

    def _fixed(self, depth: int, i: int) -> tuple[Any, ...]:
        """What layer ``i`` of a ``depth``-layer plan takes from the base: its attention kind, and
        its head width, KV heads and MLP width where the space leaves them to the base."""
        out = []
        for name in ("attention", "head_dim", "kv_heads", "mlp_hidden"):
            value = getattr(self.base, name)
            if isinstance(value, list) and len(set(value)) > 1:
                if depth != self.base.n_layers:
                    raise HeadwiseError(f"the base model's per-layer {name} {value} fix its depth at "
                                        f"{self.base.n_layers}: give [space] depth = {self.base.n_layers}, "
                                        f"or one {name} for every layer")
                value = value[i]
            elif isinstance(value, list):
                value = value[0]
            out.append(value)
        if out[0] is None:
            out[0] = DEFAULT_KIND
        if out[3] is None:
            out[3] = int(round(self.base.mlp_ratio * self.base.d_model))
        return tuple(out)

    def _candidates(self, fixed: tuple[Any, ...]) -> Iterator[LayerShape]:
        kind, base_head_dim, base_kv, base_mlp = fixed
        d_model = self.base.d_model
        head_dim, kv = self.config.head_dim, self.config.kv_heads
        for h in self._heads():
            if head_dim is None and base_head_dim is None or head_dim == "tied":
                if d_model % h:
                    continue
                widths = [d_model // h]
            elif head_dim is None:
                widths = [base_head_dim]
            else:
                widths = [head_dim] if isinstance(head_dim, int) else sorted(set(head_dim))
            if kv is None:
                kvs = [base_kv if base_kv is not None else h]
            else:
                kvs = divisors(h) if kv == "divisors" else sorted(set(kv))
            for w in widths:
                for k in kvs:
                    if h % k:
                        continue
                    for hidden in self.mlp_ratios or [base_mlp]:
                        yield LayerShape(h, head_dim=w, mlp_hidden=hidden, attention=kind, kv_heads=k)

    def _options_at(self, depth: int, i: int) -> list[LayerOption]:
        """Layer ``i``'s options in a ``depth``-layer plan with their costs, each a layer the
        model accepts (checked on a one-layer spec: divisibility, KV groups, RoPE pairs, gated
        MLP widths), sorted by their choices."""
        fixed = self._fixed(depth, i)
        if fixed not in self._options:
            options = []
            for choice in self._candidates(fixed):
                try:
                    one = self.base.with_layers([choice])
                except ValueError as exc:
                    self._last_refusal = f"{choice}: {str(exc).splitlines()[-1].strip()}"
                    continue
                options.append(LayerOption(choice, self.cost.layer_cost(one, 0)))
            self._options[fixed] = sorted(options, key=lambda o: [getattr(o.choice, FIELDS[d]) for d in DIMS])
        return self._options[fixed]

    def _why_no_option(self) -> str:
        last = getattr(self, "_last_refusal", None)
        heads, d_model = self._heads(), self.base.d_model
        tied = self.config.head_dim == "tied" or self.config.head_dim is None and self.base.head_dim is None
        if last:
            return f"every choice fails a check of the model (last: {last})"
        if tied and all(d_model % h for h in heads):
            return (f"heads {heads} do not divide d_model {d_model}, and head_dim is tied to d_model / heads: give "
                    "heads that divide it, or a head_dim")
        return f"no heads in {heads} is a multiple of the KV heads the space or the base allow"

    def run_sets(self, plan: Plan) -> dict[str, Any]:
        """The run-config keys that make the base model this plan."""
        sets: dict[str, Any] = {"model.n_layers": plan.n_layers, "model.heads": list(plan.heads)}
        if self.sets_head_dim:
            sets["model.head_dim"] = list(plan.head_dims)
        if self.sets_kv_heads:
            sets["model.kv_heads"] = list(plan.kv_heads)
        if self.sets_mlp:
            sets["model.mlp_hidden"] = list(plan.mlp_hidden)
        return sets

    def predicted(self, plan: Plan) -> int:
        """The budget metric of ``plan`` as the space computes it (the search checks it against
        :func:`~headwise.params.plan_budget` of the plan's spec)."""
        # looked up layer by layer: each layer's options are those of what it takes from the base
        costs = [{o.choice: o.cost for o in self._options_at(plan.n_layers, i)} for i in range(plan.n_layers)]
        return self.cost.value(self.constant + sum(c[choice] for c, choice in zip(costs, plan.layers)))


class Space(PlanSpace):
    """The plans of a base model that a ``[space]`` table allows and a budget keeps, every
    layer's choices drawn one by one (the module's docstring says how)."""

    def __init__(self, config: Any, base: ModelSpec, budget: BudgetConfig | None, seq_len: int) -> None:
        super().__init__(config, base, budget, seq_len)
        self._rests: dict[int, list[Any]] = {}
        self._sums = 0
        self.feasible_depths = [d for d in self.depths if self._admits(self.constant, d, 0)]
        if not self.feasible_depths:
            raise HeadwiseError(f"no plan of the space meets the budget {budget.describe()}: "  # type: ignore[union-attr]
                                f"{self._range_note()}; widen the space or the budget")

    # ---- what the layers still to choose can add ------------------------------------------

    @property
    def _exact_sums(self) -> bool:
        """True when bounds alone cannot decide: a target, or a floor and a cap together."""
        b = self.budget
        return b is not None and b.low is not None and b.high is not None

    def _rest(self, depth: int, i: int) -> Any:
        """Layers ``i .. depth-1``: (smallest, largest) sum they can add, or their sorted sums."""
        if depth not in self._rests:
            rests: list[Any] = [None] * (depth + 1)
            rests[depth] = [0] if self._exact_sums else (0, 0)
            for j in range(depth - 1, -1, -1):
                costs = sorted({o.cost for o in self._options_at(depth, j)})
                if not costs:
                    rests[j] = [] if self._exact_sums else None
                elif not self._exact_sums:
                    after = rests[j + 1]
                    rests[j] = None if after is None else (costs[0] + after[0], costs[-1] + after[1])
                else:
                    high = self.budget.high  # type: ignore[union-attr]
                    sums = {c + s for c in costs for s in rests[j + 1]
                            if self.cost.value(self.constant + c + s) <= high}
                    self._sums += len(sums)
                    if self._sums > MAX_SUMS:
                        raise HeadwiseError(f"the space is too large to check the budget {self.budget.describe()} "  # type: ignore[union-attr]
                                            "exactly (more than 2 million partial sums): give a cap or a floor alone, "
                                            "or narrow the space")
                    rests[j] = sorted(sums)
            self._rests[depth] = rests
        return self._rests[depth][i]

    def _admits(self, raw: int, depth: int, i: int) -> bool:
        """True when a plan that has spent ``raw`` (the constant and layers before ``i``) can be
        completed by layers ``i .. depth-1`` within the budget."""
        rest = self._rest(depth, i)
        if rest is None or rest == []:
            return False
        if self.budget is None:
            return True
        value, low, high = self.cost.value, self.budget.low, self.budget.high
        if not self._exact_sums:
            return (high is None or value(raw + rest[0]) <= high) and (low is None or value(raw + rest[1]) >= low)
        k = bisect.bisect_left(rest, low, key=lambda s: value(raw + s))
        return k < len(rest) and value(raw + rest[k]) <= high

    def _range_note(self) -> str:
        """The smallest and largest value the space's plans reach, for a refusal."""
        lows, highs = [], []
        for d in self.depths:
            costs = [[o.cost for o in self._options_at(d, i)] for i in range(d)]
            if all(costs):
                lows.append(self.cost.value(self.constant + sum(min(c) for c in costs)))
                highs.append(self.cost.value(self.constant + sum(max(c) for c in costs)))
        if not lows:
            return "no depth has options in every layer"
        return f"its plans' {self.cost.metric} run from {min(lows)} to {max(highs)}" + (
            " (not every value between)" if self._exact_sums else "")

    # ---- numbers to plans and back ----------------------------------------------------------

    def _walk(self, choose: Callable[[str, list[Any]], Any]) -> Plan:
        """The plan made by ``choose(parameter name, sorted feasible values)`` at each choice."""
        depth = choose("depth", self.feasible_depths) if len(self.depths) > 1 else self.feasible_depths[0]
        raw, layers = self.constant, []
        for i in range(depth):
            options = [o for o in self._options_at(depth, i) if self._admits(raw + o.cost, depth, i + 1)]
            for dim in DIMS:
                if self.varies[dim]:
                    chosen = choose(f"layer{i}.{dim}", sorted({self._value(o.choice, dim) for o in options}))
                    options = [o for o in options if self._value(o.choice, dim) == chosen]
            if len(options) != 1:  # the fixed choices leave one option; anything else is a bug
                raise AssertionError(f"layer {i}: {len(options)} options left after every choice")
            raw += options[0].cost
            layers.append(options[0].choice)
        return Plan(Scheme.EXPLICIT, layers)

    def _value(self, choice: LayerShape, dim: str) -> Any:
        """A layer's value of choice ``dim`` as its parameter gives it (an MLP width as its ratio)."""
        value = getattr(choice, FIELDS[dim])
        return self.mlp_ratios.get(value, value / self.base.d_model) if dim == "mlp_ratio" else value

    def choices(self, name: str) -> list[Any]:
        if name == "depth":
            return self.depths
        layer, _, dim = name[5:].partition(".")
        return sorted({self._value(o.choice, dim) for d in self.depths if int(layer) < d
                       for o in self._options_at(d, int(layer))})

    def encode(self, plan: Plan) -> dict[str, Any]:
        params: dict[str, Any] = {}

        def choose(name: str, values: list[Any]) -> Any:
            layer, _, dim = name[5:].partition(".")
            want = plan.n_layers if name == "depth" else self._value(plan.layers[int(layer)], dim)
            if want not in values:
                where = "depth" if name == "depth" else f"layer {layer} {dim}"
                raise HeadwiseError(f"{where} {want} is not one the space and the budget leave ({values})")
            params[name] = want
            return want

        if plan.n_layers not in self.depths:
            raise HeadwiseError(f"depth {plan.n_layers} is outside the space's {self.depths[0]}..{self.depths[-1]}")
        if self._walk(choose).layers != plan.layers:
            raise HeadwiseError(f"{plan.describe()} is not a plan of the space (its layers' other choices differ)")
        return params

    def plans(self, limit: int | None = None) -> Iterator[Plan]:
        """Every feasible plan (depth-first, in sorted order); at most ``limit``."""
        count = 0
        for depth in self.feasible_depths:
            stack: list[tuple[int, int, tuple[LayerShape, ...]]] = [(0, self.constant, ())]
            while stack:
                i, raw, layers = stack.pop()
                if i == depth:
                    yield Plan(Scheme.EXPLICIT, layers)
                    count += 1
                    if limit is not None and count >= limit:
                        return
                    continue
                ok = [o for o in self._options_at(depth, i) if self._admits(raw + o.cost, depth, i + 1)]
                stack.extend((i + 1, raw + o.cost, (*layers, o.choice)) for o in reversed(ok))

    def count(self, limit: int = 1_000_000) -> int | None:
        """How many feasible plans there are (None: more than ``limit`` partial states to count)."""
        total, states = 0, 0
        for depth in self.feasible_depths:
            ways: dict[int, int] = {self.constant: 1}
            for i in range(depth):
                nxt: dict[int, int] = {}
                for raw, n in ways.items():
                    for o in self._options_at(depth, i):
                        if self._admits(raw + o.cost, depth, i + 1):
                            nxt[raw + o.cost] = nxt.get(raw + o.cost, 0) + n
                states += len(nxt)
                if states > limit:
                    return None
                ways = nxt
            total += sum(ways.values())
        return total

    def _draws(self) -> str:
        """The per-layer space draws each varying choice of each layer."""
        return "a choice per layer (" + ", ".join(d for d in DIMS if self.varies[d]) + ")"

    def size(self) -> int:
        """How many plans the space holds before the budget."""
        return sum(math.prod(len(self._options_at(d, i)) for i in range(d)) for d in self.depths)
