"""A scaled search space: the whole plan set by a few numbers, so the space does not grow with
depth (issue 35).

    [space]
    scaling = "linear"            # OpenELM's layer-wise scaling; or "geometric" (the blog's schemes)
    depth = [2, 8]                # as in the per-layer space: one count, or [min, max]
    heads = "divisors"            # the counts a layer may have: divisors of d_model, or a list
    # ratio = [0.5, 1.0, 2.0]     # geometric only: each layer's heads over the layer before's
    # kv_heads = "divisors"       # the first and last layer's (linear) or the first's (geometric)
    # mlp_ratio = [1.0, 2.0, 4.0] # the first and last layer's MLP ratio, ramped between them

``linear`` (OpenELM, Mehta et al. 2024): the optimiser draws the first and the last layer's
heads (``first.heads``, ``last.heads``). Layer i's count is their ramp as OpenELM ramps its
multipliers (:func:`headwise.plans.ramp`: linspace, rounded to 2 decimals), made whole as
OpenELM rounds its widths (:func:`headwise.plans.make_divisible` to a multiple of one head: half
up, never more than 10% low), then snapped to the nearest count the layer allows
(:func:`headwise.plans.nearest_count`, the schemes' rule: the smaller on a tie). ``geometric`` (the
blog's ascending and descending schemes): the first layer's heads and a ``ratio`` from the list
(default 0.5, 1 and 2: descending, constant, ascending); layer i's count is ``first * ratio**i``
snapped the same way.

KV heads, where the space gives ``kv_heads``: under ``linear`` the first and last layer's
(``first.kv_heads``, ``last.kv_heads``), ramped as the heads are; under ``geometric`` the first
layer's, grown by the heads' ratio, so every layer keeps about the first layer's query heads per
KV head (as OpenELM keeps its groups). Each is snapped to a count the layer allows with its heads
(one that divides them). Without ``kv_heads`` each layer has the base's. MLP ratio, where the
space gives ``mlp_ratio``: under either scaling the first and last layer's (``first.mlp_ratio``,
``last.mlp_ratio``), ramped as OpenELM ramps its FFN multipliers and snapped to the nearest ratio
offered. Head widths are tied, one width or the base's: a list of several is refused, since a
scaled plan has no per-layer choice. A one-layer plan's last layer is its first.

What a layer allows is the per-layer space's option list (:meth:`PlanSpace._options_at`, with
every check of the model). A scaled space's settings are few (heads^2 x KV pairs x MLP pairs per
depth), so its plans are all made once: settings that make one plan are one plan (the first
setting in sorted order names it), and plans that miss the budget, computed exactly through the
same :class:`~headwise.budget.CostModel`, are dropped. The optimiser's numbers are the
values themselves (``depth``, ``first.heads``, ``last.heads`` or ``ratio``, ``first.kv_heads``,
``last.kv_heads``, ``first.mlp_ratio``, ``last.mlp_ratio``, each over every value it takes in some
setting), taken in that order and each repaired to the nearest value that still leads to one of
those plans, as the per-layer space repairs its own. So every value decodes to a plan within the
budget, every such plan is reachable (:meth:`ScaledSpace.encode`), and a space with none is
refused in one line.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Sequence

from headwise.errors import HeadwiseError
from headwise.plans import Plan, Scheme, make_divisible, nearest_count, ramp, scheme_shape
from headwise.budget import BudgetConfig
from headwise.search.space import LayerOption, PlanSpace
from headwise.spec import ModelSpec

#: the geometric scaling's ratios when the space gives none: descending, constant, ascending
RATIOS = (0.5, 1.0, 2.0)
#: the choices of a layer a scaled space sets, in the order its numbers are drawn
LEVELS = ("heads", "kv_heads", "mlp_ratio")
#: settings made, over every depth, before a scaled space is too large to list
MAX_SETTINGS = 500_000

#: a layer's options as a tree: heads -> KV heads -> MLP ratio -> option
Tree = dict[Any, Any]


def linear_counts(first: int, last: int, depth: int) -> list[int]:
    """Whole counts from ``first`` to ``last`` over ``depth`` layers, as OpenELM makes its layers'
    widths: the linear ramp rounded to 2 decimals, each made whole by ``make_divisible(v, 1)``."""
    return [make_divisible(v, 1) for v in ramp(first, last, depth)]


def geometric_counts(first: float, ratio: float, depth: int) -> list[float]:
    """``first * ratio**i`` for each layer i: the blog's ascending scheme (descending for a ratio
    below 1), before snapping to allowed counts."""
    return [first * s for s in scheme_shape(Scheme.ASCENDING, depth, ratio)]


def snap(allowed: Sequence[Any], target: float | None) -> Any:
    """The allowed value nearest ``target`` (the smaller on a tie; ``allowed`` sorted); the only
    one where there is one (a choice the space leaves to the base: no target)."""
    return allowed[0] if len(allowed) == 1 else nearest_count(allowed, target)  # type: ignore[arg-type]


class ScaledSpace(PlanSpace):
    """The plans of a base model that a ``[space]`` table with ``scaling`` makes and a budget
    keeps, each set by a few numbers (the module's docstring says how)."""

    def __init__(self, config: Any, base: ModelSpec, budget: BudgetConfig | None, seq_len: int) -> None:
        super().__init__(config, base, budget, seq_len)
        self.scaling: str = config.scaling
        self.ratios = sorted(set(config.ratio or RATIOS))
        #: the choices the numbers set: the heads, and KV heads and MLP ratio where the space gives them
        self.levels = [lv for lv in LEVELS if lv == "heads" or getattr(config, lv) is not None]
        numbers = self._numbers()
        #: the numbers of a setting, in order, and those the optimiser draws (the others have one value)
        self.names = [n for lv in self.levels for n, _ in numbers[lv]]
        self.drawn = {n for lv in self.levels for n, varies in numbers[lv] if varies}
        #: per depth, every plan made (before the budget): its setting and its budget metric
        self._made: dict[int, dict[Plan, tuple[tuple[Any, ...], int]]] = {}
        #: per depth, the settings of the plans within the budget, as a tree of their numbers
        self._tries: dict[int, Tree] = {}
        #: every value each number takes in some setting (before the budget)
        self._values: dict[str, set[Any]] = {n: set() for n in self.names}
        self._make()
        self.feasible_depths = [d for d in self.depths if self._tries.get(d)]
        if not self.feasible_depths:
            values = [v for made in self._made.values() for _, v in made.values()]
            raise HeadwiseError(f"no plan of the space meets the budget {budget.describe()}: "  # type: ignore[union-attr]
                                f"its {len(values)} {self.scaling}-scaled plans' {self.cost.metric} run from "
                                f"{min(values)} to {max(values)} (not every value between); "
                                "widen the space or the budget")

    def _numbers(self) -> dict[str, list[tuple[str, bool]]]:
        """Each level's numbers, as (parameter name, whether the space offers more than one value)."""
        heads_vary, kv_varies, mlp_varies = (self.varies[d] for d in ("heads", "kv_heads", "mlp_ratio"))
        if self.scaling == "linear":
            return {"heads": [("first.heads", heads_vary), ("last.heads", heads_vary)],
                    "kv_heads": [("first.kv_heads", kv_varies), ("last.kv_heads", kv_varies)],
                    "mlp_ratio": [("first.mlp_ratio", mlp_varies), ("last.mlp_ratio", mlp_varies)]}
        return {"heads": [("first.heads", heads_vary), ("ratio", len(self.ratios) > 1)],
                "kv_heads": [("first.kv_heads", kv_varies)],  # they grow by the heads' ratio
                "mlp_ratio": [("first.mlp_ratio", mlp_varies), ("last.mlp_ratio", mlp_varies)]}

    # ---- the plans, made once --------------------------------------------------------------

    def _make(self) -> None:
        """Make every setting's plan once per depth, keeping the first setting of each plan and,
        in the tries, those within the budget."""
        made = 0
        for depth in self.depths:
            if not all(self._options_at(depth, i) for i in range(depth)):
                continue
            plans, trie = self._made.setdefault(depth, {}), self._tries.setdefault(depth, {})
            trees = [self._tree(self._options_at(depth, i)) for i in range(depth)]
            for setting, options in self._settings(depth, 0, (), trees):
                made += 1
                if made > MAX_SETTINGS:
                    raise HeadwiseError(f"the {self.scaling}-scaled space has more than {MAX_SETTINGS:,} settings to "
                                        "check: narrow its heads, kv_heads, mlp_ratio or depths")
                for name, number in zip(self.names, setting):
                    self._values[name].add(number)
                plan = Plan(Scheme.EXPLICIT, tuple(o.choice for o in options))
                if plan in plans:  # an earlier setting rounds to the same plan and names it
                    continue
                value = self.cost.value(self.constant + sum(o.cost for o in options))
                plans[plan] = (setting, value)
                if self.budget is None or self.budget.allows(value):
                    node = trie
                    for number in setting[:-1]:
                        node = node.setdefault(number, {})
                    node[setting[-1]] = plan

    def _tree(self, options: list[LayerOption]) -> Tree:
        """Options by heads, KV heads and MLP ratio (None where the space leaves the MLP to the
        base); each level's keys in order, as the options come sorted by their choices."""
        tree: Tree = {}
        for o in options:
            c = o.choice
            tree.setdefault(c.heads, {}).setdefault(c.kv_heads, {})[self.mlp_ratios.get(c.mlp_hidden)] = o
        return tree

    def _settings(self, depth: int, level: int, setting: tuple[Any, ...],
                  nodes: list[Any]) -> Iterator[tuple[tuple[Any, ...], list[LayerOption]]]:
        """Every setting of the numbers from ``LEVELS[level]`` on, in sorted order, with the
        options its layers snap to; ``nodes`` are each layer's options under its choices so far."""
        if level == len(LEVELS):
            yield setting, nodes
            return
        if LEVELS[level] not in self.levels:  # left to the base: one value in every layer
            yield from self._settings(depth, level + 1, setting, [next(iter(n.values())) for n in nodes])
            return
        for first in nodes[0]:
            for second in self._seconds(LEVELS[level], first, depth, nodes):
                targets = self._targets(LEVELS[level], first, second, depth, setting)
                chosen = [n[snap(list(n), t)] for n, t in zip(nodes, targets)]
                numbers = (first,) if second is None else (first, second)
                yield from self._settings(depth, level + 1, setting + numbers, chosen)

    def _seconds(self, level: str, first: Any, depth: int, nodes: list[Any]) -> list[Any]:
        """The values of a level's second number: the last layer's (its first's in a one-layer
        plan), the geometric ratios, or [None] for the geometric KV heads (they follow the ratio)."""
        if self.scaling == "geometric" and level != "mlp_ratio":
            return self.ratios if level == "heads" else [None]
        return [first] if depth == 1 else list(nodes[-1])

    def _targets(self, level: str, first: Any, second: Any, depth: int, setting: tuple[Any, ...]) -> list[float]:
        """Each layer's value before snapping."""
        if level == "mlp_ratio":  # as OpenELM ramps its FFN multipliers (rounded to 2 decimals)
            return ramp(first, second, depth)
        if self.scaling == "linear":
            return linear_counts(first, second, depth)
        # geometric: the heads' ratio is the second number drawn; KV heads grow by it too
        return geometric_counts(first, second if level == "heads" else setting[1], depth)

    # ---- numbers to plans and back ----------------------------------------------------------

    def _walk(self, choose: Callable[[str, list[Any]], Any]) -> Plan:
        """The plan made by ``choose(parameter name, sorted values still leading to a plan)``."""
        depth = choose("depth", self.feasible_depths) if len(self.depths) > 1 else self.feasible_depths[0]
        node: Any = self._tries[depth]
        for name in self.names:
            values = sorted(node)
            node = node[choose(name, values) if name in self.drawn else values[0]]
        return node

    def choices(self, name: str) -> list[Any]:
        return self.depths if name == "depth" else sorted(self._values[name])

    def encode(self, plan: Plan) -> dict[str, Any]:
        """The values :meth:`decode` maps to ``plan``; a HeadwiseError (saying why) when the
        scaling does not make the plan or it misses the budget."""
        if plan.n_layers not in self.depths:
            raise HeadwiseError(f"depth {plan.n_layers} is outside the space's {self.depths[0]}..{self.depths[-1]}")
        made = self._made.get(plan.n_layers, {}).get(plan)
        if made is None:
            raise HeadwiseError(f"{plan.describe()} is not a plan the {self.scaling} scaling makes")
        setting, value = made
        if self.budget is not None and not self.budget.allows(value):
            raise HeadwiseError(f"{plan.describe()}: its {self.cost.metric} {value} misses the budget "
                                f"{self.budget.describe()}")
        wanted = dict(zip(["depth", *self.names], [plan.n_layers, *setting]))
        params: dict[str, Any] = {}

        def choose(name: str, values: list[Any]) -> Any:
            params[name] = wanted[name]
            return wanted[name]

        self._walk(choose)
        return params

    def plans(self, limit: int | None = None) -> Iterator[Plan]:
        """Every feasible plan, once each (by depth, in the order of their settings); at most ``limit``."""
        feasible = (p for d in self.feasible_depths for p, (_, v) in self._made[d].items()
                    if self.budget is None or self.budget.allows(v))
        return itertools.islice(feasible, limit)

    def count(self, limit: int = 1_000_000) -> int | None:
        """How many feasible plans there are (all are made, so ``limit`` never applies)."""
        return sum(1 for _ in self.plans())

    def _draws(self) -> str:
        """The scaled space draws a few numbers for the whole plan."""
        return f"{self.scaling} scaling of " + ", ".join(n for n in self.names if n in self.drawn)

    def size(self) -> int:
        """How many plans the scaling makes before the budget."""
        return sum(len(made) for made in self._made.values())
