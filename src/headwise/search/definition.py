"""Search files: a base run, a space of head plans, a budget, objectives and the trials' fidelity,
loaded, with named presets, as study files are (:mod:`headwise.study.definition_file`).

    name = "progression"
    description = "..."
    default_preset = "tiny"
    seed = 0                        # the sampler's seed (trial n samples with seed + n)
    trials = 24                     # trials over the whole search: the named plans, then sampled ones
    # sampler = "random"            # or "tpe", "nsga2" (default: TPE for one objective, NSGA-II for several)

    [base]                          # a run config (the tables of ``headwise train``), no [model.plan]
    model.preset = "tiny-lm"

    [space]                         # headwise.search.space
    depth = 4
    heads = "divisors"
    # scaling = "linear"            # or "geometric": a few numbers set every layer (headwise.search.scaled)
    # lr = [1e-3, 1e-2]             # optim.lr of each trial, drawn with the plan (log scale)

    [budget]                        # headwise.budget
    metric = "total_heads"
    target = 180

    [[objectives]]                  # eval metrics the task reports, or a budget metric
    metric = "loss"                 #   (several: NSGA-II, e.g. loss and kv_bytes_per_token)
    direction = "minimize"

    [fidelity]                      # how each trial trains
    steps = 300                     # train.steps of every trial
    pruner = "successive_halving"   # or "hyperband", "none" (one objective only)
    min_steps = 50                  # the pruner's first rung (default: eval.every)
    run_seed = 100                  # train.seed of every trial (the confirmation's seeds differ)
    set = { "task.validation" = "fraction:0.05" }   # run-config keys of the trials only, never the
                                    #   confirmation's: here they select on held-out training data

    [[named]]                       # fixed plans run first, at the trials' fidelity (default: the
    name = "constant"               #   constant, ascending and descending schemes at the budget's
    scheme = "constant"             #   total heads when the budget is on total_heads)
    total_heads = 180
    # or: heads = [...], head_dim = ..., kv_heads = [...], mlp_ratio = ..., depth = ...

    [confirm]                       # headwise.search.confirm: the verdict study after the search
    top_k = 2
    seeds = 5
    steps = 600
    baseline = "constant"
    nuisance = { values = { "optim.lr" = [2e-3, 5e-3, 1.25e-2] }, selection = { ... } }

    [runner]
    jobs = 2
    threads = 1

    [presets.quick]
    extends = "tiny"
    ...

The built-in searches are the family folders' ``search-NAME.toml`` files, found as the built-in
studies are (:func:`headwise.families.family_files`), named ``NAME``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from headwise.config import Config, apply_overrides, flatten, quoting_hints, set_dotted
from headwise.errors import HeadwiseError
from headwise.params import plan_budget
from headwise.plans import Plan, Scheme, plan_heads
from headwise.presets import preset_dict
from headwise.budget import METRICS, BudgetConfig
from headwise.search.scaled import ScaledSpace
from headwise.search.space import PlanSpace, Space
from headwise.study.claims import metric_problem
from headwise.study.definition import RunnerDefaults, broadcast_heads
from headwise.study.definition_file import SEARCH_PREFIX, Definition, FileKind, Objective, identity, merge_preset
from headwise.train.config import RunConfig, resolve_run_model


class SpaceConfig(Config):
    """``[space]``: what each layer may be (see :mod:`headwise.search.space`), and with
    ``scaling`` how a few numbers set them all (see :mod:`headwise.search.scaled`)."""

    depth: int | list[int] | None = None
    heads: Literal["divisors"] | list[int]
    head_dim: Literal["tied"] | int | list[int] | None = None
    kv_heads: Literal["divisors"] | list[int] | None = None
    mlp_ratio: list[float] | None = None
    #: None: every layer's choices drawn; "linear" (OpenELM) or "geometric" (the blog's schemes)
    scaling: Literal["linear", "geometric"] | None = None
    #: geometric: the ratios of a layer's heads to the layer before's (default 0.5, 1, 2)
    ratio: list[float] | None = None
    #: [low, high]: each trial's optim.lr, drawn with its plan on a log scale (None: the base's)
    lr: list[float] | None = None

    @field_validator("depth")
    @classmethod
    def _depth(cls, v: int | list[int] | None) -> int | list[int] | None:
        if isinstance(v, list) and (len(v) != 2 or v[0] > v[1]):
            raise ValueError(f"depth {v}: give one count or [min, max] with min <= max")
        if v is not None and min(v if isinstance(v, list) else [v]) < 1:
            raise ValueError(f"depth {v}: a model needs at least 1 layer")
        return v

    @field_validator("lr")
    @classmethod
    def _lr(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) != 2 or not 0 < v[0] < v[1]):
            raise ValueError(f"lr {v}: give the range [low, high], 0 < low < high, that the trials' optim.lr is "
                             "drawn from (log scale)")
        return v

    @field_validator("heads", "head_dim", "kv_heads", "mlp_ratio", "ratio")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("an empty list allows nothing: give at least one value")
        if isinstance(v, list) and min(v) <= 0 or isinstance(v, int) and v <= 0:
            raise ValueError(f"{v}: every value must be positive")
        return v

    @model_validator(mode="after")
    def _scaled(self) -> "SpaceConfig":
        if self.ratio is not None and self.scaling != "geometric":
            raise ValueError(f"ratio {self.ratio} is the geometric scaling's growth per layer: give "
                             "scaling = \"geometric\" with it, or remove it")
        if self.scaling is not None and isinstance(self.head_dim, list) and len(set(self.head_dim)) > 1:
            raise ValueError(f"scaling {self.scaling!r} sets every layer from a few numbers, with no choice per "
                             f"layer: give head_dim one width or \"tied\", not {self.head_dim}")
        return self


class SearchObjective(Objective):
    """An objective as the search runs it: measured by its trials or computed from the plan."""

    @property
    def from_budget(self) -> bool:
        """True for a metric computed from the plan rather than measured by training."""
        return self.metric in METRICS


#: run-config keys [fidelity] set may not give: the fidelity's own (steps, run_seed) set them
FIDELITY_KEYS = {"train.steps": "steps", "train.epochs": "steps", "train.tokens": "steps", "train.seed": "run_seed"}


class FidelityConfig(Config):
    """``[fidelity]``: how each trial trains, and when a poor one is stopped."""

    steps: int | None = Field(default=None, gt=0)
    pruner: Literal["none", "successive_halving", "hyperband"] = "none"
    min_steps: int | None = Field(default=None, gt=0)
    reduction_factor: int = Field(default=3, ge=2)
    run_seed: int = Field(default=100, ge=0)
    #: dotted run-config keys set on the trials only, never on the confirmation: a selection split
    #: (``{ "task.validation" = "fraction:0.05" }``), so that the plans are chosen on other data
    #: than the confirmation compares them on
    set: dict[str, Any] | None = None

    @field_validator("set")
    @classmethod
    def _set(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # as dotted keys (a table written nested says the same), and none when empty, so that a
        # file with no keys here keeps the fingerprint it had before this table existed
        flat = flatten(v or {})
        for key in flat:
            if key in FIDELITY_KEYS:
                raise ValueError(f"{key} is the trials' {FIDELITY_KEYS[key]}: give [fidelity] "
                                 f"{FIDELITY_KEYS[key]} instead")
            if key.split(".")[0] == "model":
                raise ValueError(f"{key}: the space sets the trials' model, and the confirmation must train the "
                                 "plans the trials did: set model keys in [base]")
        return flat or None

    def describe_set(self) -> str:
        """``task.validation = 'fraction:0.05'``, the trials-only keys as a line ("" without)."""
        return ", ".join(f"{k} = {v!r}" for k, v in (self.set or {}).items())


class NamedPlan(Config):
    """A fixed plan: a scheme of :func:`headwise.plans.plan_heads` or heads given per layer."""

    name: str
    scheme: Literal["constant", "ascending", "descending", "linear"] | None = None
    total_heads: int | None = Field(default=None, gt=0)
    ratio: float = Field(default=2.0, gt=0)
    depth: int | None = Field(default=None, gt=0)
    heads: list[int] | None = None
    head_dim: int | list[int] | None = None
    kv_heads: int | list[int] | None = None
    mlp_ratio: float | list[float] | None = None

    @model_validator(mode="after")
    def _one_way(self) -> "NamedPlan":
        if (self.scheme is None) == (self.heads is None):
            raise ValueError(f"named plan {self.name!r}: give a scheme or the heads per layer (one of them)")
        return self


class ConfirmConfig(Config):
    """``[confirm]``: the verdict study run after the search (:mod:`headwise.search.confirm`)."""

    enabled: bool = True
    top_k: int = Field(default=2, ge=1)
    seeds: int = Field(default=5, ge=2)
    #: train.steps of its runs (None: the trials')
    steps: int | None = Field(default=None, gt=0)
    #: the named plan the claim compares the search's best with
    baseline: str = "constant"
    #: the study's [nuisance] table (settings tuned per variant), as a study file gives it
    nuisance: dict[str, Any] | None = None
    #: the study's [report] table
    report: dict[str, Any] = Field(default_factory=dict)


class SearchConfig(Config):
    """A search after its preset is merged in."""

    name: str
    description: str = ""
    seed: int = Field(default=0, ge=0)
    trials: int = Field(gt=0)
    #: Optuna's sampler (None: TPE for one objective, NSGA-II for several)
    sampler: Literal["tpe", "nsga2", "random"] | None = None
    base: dict[str, Any]
    space: SpaceConfig
    budget: BudgetConfig | None = None
    objectives: list[SearchObjective] = Field(default_factory=lambda: [SearchObjective()], min_length=1)
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig)
    named: list[NamedPlan] | None = None
    runner: RunnerDefaults = Field(default_factory=RunnerDefaults)
    confirm: ConfirmConfig = Field(default_factory=ConfirmConfig)

    @property
    def sampler_kind(self) -> str:
        """The sampler the search uses: the file's, else TPE for one objective, NSGA-II for several."""
        return self.sampler or ("nsga2" if len(self.objectives) > 1 else "tpe")


#: the run-config key of the learning rate a search may draw with each plan ([space] lr)
LR = "optim.lr"


@dataclass
class Named:
    """A named plan as the search resolved it."""

    name: str
    #: the plan (None: it makes no model of the base)
    plan: Plan | None
    #: the run-config keys that make it (a scheme's through [model.plan], for the confirmation)
    sets: dict[str, Any]
    #: True when the space holds it within the budget: then it runs as a trial
    in_space: bool
    note: str = ""


@dataclass
class Search(Definition):
    """A resolved search: its config, where it came from, the trials' base run config and space."""

    config: SearchConfig
    #: the trials' base run config: the file's base at the fidelity's steps and seed, with [fidelity] set
    base: dict[str, Any]
    space: PlanSpace
    named: list[Named]
    seq_len: int
    #: the same without [fidelity] set: what the confirmation's runs start from
    confirm_base: dict[str, Any]

    def run_config(self, sets: dict[str, Any]) -> dict[str, Any]:
        """The base run config with ``sets`` (dotted keys) applied."""
        cfg = copy.deepcopy(self.base)
        for key, value in sets.items():
            set_dotted(cfg, key, value)
        return cfg

    @property
    def first_rung(self) -> int:
        """The step the pruner first judges a trial at: [fidelity] min_steps, else the eval interval."""
        return self.config.fidelity.min_steps or int(self.base.get("eval", {}).get("every", 1))

    def trial_config(self, plan: Plan, lr: float | None = None) -> dict[str, Any]:
        """The run config of a trial of ``plan`` (at learning rate ``lr``; None: the base's)."""
        return self.run_config({**self.space.run_sets(plan), **({LR: lr} if lr is not None else {})})

    def budget_of(self, plan: Plan) -> dict[str, int]:
        """Every budget metric of ``plan``, exactly, from the base's spec with the plan's layers
        (no model is built)."""
        return plan_budget(self.space.base.with_layers(plan.layers), self.seq_len,
                           self.config.budget.dtype if self.config.budget else "fp32")

    def identity(self) -> dict[str, Any]:
        """What a rerun must match: everything that decides the trials (base, space, budget,
        objectives, fidelity with its set, named plans, seed), not how many trials, how fast, or
        the confirmation (its study directory checks its own identity). A [fidelity] without set
        saves none (an empty one neither), so such a search keeps the fingerprint it had."""
        return search_identity(self.name, self.preset, self.config.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The saved form (``search.toml``)."""
        return {"name": self.name, "source": self.source, "preset": self.preset or "",
                "preset_summary": self.preset_summary, "fingerprint": self.fingerprint(),
                "definition": self.config.to_dict()}


def search_identity(name: str, preset: str | None, definition: dict[str, Any]) -> dict[str, Any]:
    """The identity of a search from its name, preset and resolved definition (see
    :meth:`Search.identity`); also how a saved search is compared with a new one."""
    return identity(name, preset, {k: v for k, v in definition.items()
                                   if k not in ("runner", "confirm", "trials", "description")})


#: search files: the family folders' ``search-NAME.toml``, named NAME
SEARCH_FILES = FileKind("search", "searches", prefix=SEARCH_PREFIX)
builtin_searches = SEARCH_FILES.builtins
load_search_file = SEARCH_FILES.load


def resolve_search(raw: dict[str, Any], source: str, preset: str | None = None,
                   overrides: list[str] | None = None, trials: int | None = None) -> Search:
    """Merge the preset, apply ``key=value`` overrides to the base, and check everything a trial
    needs before any runs: the base model, the space against the budget (a space with no plan
    meeting it is refused), the objectives against what the task reports and the named plans
    (:func:`headwise.search.load_search` checks the confirmation study too)."""
    raw, preset, summary = merge_preset(raw, source, preset, what="search")
    bare = apply_overrides(raw.setdefault("base", {}), overrides or [])
    if trials is not None:
        if trials < 1:
            raise HeadwiseError(f"--trials {trials}: a search needs at least one trial")
        raw["trials"] = trials
    config = SearchConfig.parse(raw, source=source)
    shared = _shared_base(config, source)
    with quoting_hints(bare):  # where the base's run config is checked
        spec, _ = resolve_run_model(shared, source=f"{source} [base]")
        base, run = _with_fidelity_set(config, shared, RunConfig.parse(shared, source=f"{source} [base]"), source)
    seq_len = run.task.shape().seq_len
    _check_objectives(config, run, source)
    space = (ScaledSpace if config.space.scaling else Space)(config.space, spec, config.budget, seq_len)
    search = Search(config, source, preset, summary, base, space, [], seq_len, shared)
    search.named = [_resolve_named(search, n) for n in _named_plans(config, spec)]
    names = [n.name for n in search.named]
    if len(set(names)) != len(names):
        raise HeadwiseError(f"{source}: named plans repeat a name ({', '.join(names)})")
    _check_trials(search)
    return search


def _check_trials(search: Search) -> None:
    """Refuse a trial count short of the named plans (they run first), and a pruner whose first rung
    comes after the trials' last evaluation before their end (it would prune none)."""
    queued, fidelity, trials = sum(n.in_space for n in search.named), search.config.fidelity, search.config.trials
    steps, every = search.base["train"].get("steps"), int(search.base.get("eval", {}).get("every", 0))
    if trials < queued:
        raise HeadwiseError(f"search {search.name}: {trials} trial(s) cannot hold its {queued} named plans, which "
                            f"run first: give at least {queued} trials")
    last = (steps - 1) // every * every if every and steps else 0  # the final step's evaluation is never judged
    if fidelity.pruner != "none" and steps and search.first_rung > last:
        hint = f"give min_steps of at most {last}" if last else f"evaluate more often ([base.eval] every below {steps})"
        raise HeadwiseError(f"{search.source}: pruner {fidelity.pruner!r} has its first rung at step {search.first_rung} "
                            f"([fidelity] min_steps, else [base.eval] every), but the trials train {steps} steps, "
                            f"evaluated every {every}: it would prune none; {hint}, or set pruner = \"none\"")


def _shared_base(config: SearchConfig, source: str) -> dict[str, Any]:
    """The base run config the trials and the confirmation share: the file's base at the
    fidelity's steps and seed (the trials add [fidelity] set, the confirmation its own steps and
    seeds)."""
    base = copy.deepcopy(config.base)
    model = base.setdefault("model", {})
    if "plan" in model:
        raise HeadwiseError(f"{source}: the base gives [model.plan], but a search's space sets each layer's heads: "
                            "remove it")
    broadcast_heads(base)
    # the base's own heads only make its spec checkable (every trial sets its heads): a preset's
    # count in each of the base's layers when its list does not fit them
    preset = preset_dict(model["preset"]) if isinstance(model.get("preset"), str) else {}
    n_layers, heads = model.get("n_layers", preset.get("n_layers")), model.get("heads", preset.get("heads"))
    if isinstance(n_layers, int) and isinstance(heads, list) and heads and len(heads) != n_layers:
        model["heads"] = [heads[0]] * n_layers
    train = base.setdefault("train", {})
    if config.fidelity.steps is not None:
        for key in ("epochs", "tokens"):
            train.pop(key, None)
        train["steps"] = config.fidelity.steps
    train["seed"] = config.fidelity.run_seed
    every = base.get("eval", {}).get("every", 0)
    if config.fidelity.pruner != "none" and not every:
        raise HeadwiseError(f"{source}: pruner {config.fidelity.pruner!r} stops trials on their eval curve, but "
                            "the base evaluates only at the end: set [base.eval] every")
    return base


def _with_fidelity_set(config: SearchConfig, shared: dict[str, Any], shared_run: RunConfig,
                       source: str) -> tuple[dict[str, Any], RunConfig]:
    """The trials' base (``shared`` with [fidelity] set applied) and its run config (``shared_run``,
    ``shared``'s, where there is no set); a key no run config has is refused in one line that
    names the table."""
    if not config.fidelity.set:
        return shared, shared_run
    base = copy.deepcopy(shared)
    where = f"{source} [fidelity] set"
    for key, value in (config.fidelity.set or {}).items():
        try:
            set_dotted(base, key, value)
        except HeadwiseError as exc:
            raise HeadwiseError(f"{where}: {exc}") from None
    return base, RunConfig.parse(base, source=where)


def _check_objectives(config: SearchConfig, run: RunConfig, source: str) -> None:
    metrics = [o.metric for o in config.objectives]
    if len(set(metrics)) != len(metrics):
        raise HeadwiseError(f"{source}: an objective is given twice ({', '.join(metrics)})")
    for objective in config.objectives:
        if not objective.from_budget:
            problem = metric_problem(objective.metric, run.task)
            if problem:
                raise HeadwiseError(f"{source}: objective {objective.metric!r} is not a metric the trials report: "
                                    f"{problem} (or a budget metric: {', '.join(METRICS)})")
    if all(o.from_budget for o in config.objectives):
        raise HeadwiseError(f"{source}: every objective is computed from the plan; give one the trials measure "
                            "(e.g. loss), or there is nothing to train")
    if config.fidelity.pruner != "none" and (len(config.objectives) > 1 or config.objectives[0].from_budget):
        raise HeadwiseError(f"{source}: pruner {config.fidelity.pruner!r} works on one measured objective; "
                            f"this search has {', '.join(metrics)}: set [fidelity] pruner = \"none\"")


def _named_plans(config: SearchConfig, spec: Any) -> list[NamedPlan]:
    """The named plans: the file's, else the three schemes at a budget on total heads."""
    if config.named is not None:
        return config.named
    budget = config.budget
    if budget is None or budget.metric != "total_heads" or budget.high is None:
        return []
    return [NamedPlan(name=s, scheme=s, total_heads=budget.high) for s in ("constant", "ascending", "descending")]


def _per_layer(value: Any, depth: int) -> list[Any] | None:
    return None if value is None else list(value) if isinstance(value, list) else [value] * depth


def _resolve_named(search: Search, named: NamedPlan) -> Named:
    """A named plan's model and whether the search's space holds it within the budget."""
    space, d_model = search.space, search.space.base.d_model
    depth = named.depth or (len(named.heads) if named.heads else search.space.base.n_layers)
    where = f"{search.source}: named plan {named.name!r}"
    sets: dict[str, Any] = {"model.n_layers": depth}
    if named.scheme is not None:
        total = named.total_heads or (search.config.budget.high if search.config.budget else None)
        if total is None:
            raise HeadwiseError(f"{where}: scheme {named.scheme!r} needs total_heads")
        head_dim = named.head_dim if isinstance(named.head_dim, int) else space.base.head_dim
        heads = list(plan_heads(named.scheme, depth, d_model, total, ratio=named.ratio,
                                head_dim=head_dim if isinstance(head_dim, int) else None).heads)
        sets.update({"model.plan.scheme": named.scheme, "model.plan.total_heads": total,
                     "model.plan.ratio": named.ratio})
    else:
        heads = list(named.heads or [])
        sets["model.heads"] = heads
    explicit = {"model.heads": heads}
    for key, value in (("head_dim", named.head_dim), ("kv_heads", named.kv_heads)):
        if value is not None:
            sets[f"model.{key}"] = explicit[f"model.{key}"] = _per_layer(value, depth)
    ratios = _per_layer(named.mlp_ratio, depth)
    if ratios is not None:
        sets["model.mlp_hidden"] = explicit["model.mlp_hidden"] = [int(round(r * d_model)) for r in ratios]
    spec, _ = resolve_run_model(search.run_config({"model.n_layers": depth, **explicit}), source=where)
    plan = Plan(Scheme.EXPLICIT, spec.layers())
    budget = search.config.budget
    value = search.budget_of(plan)[budget.metric] if budget is not None else None
    if budget is not None and not budget.allows(value):  # type: ignore[arg-type]
        return Named(named.name, plan, sets, False, f"its {budget.metric} {value} is outside the budget "
                     f"{budget.describe()}: not a trial of the search")
    try:
        space.encode(plan)
    except HeadwiseError as exc:
        return Named(named.name, plan, sets, False, f"not in the space ({exc}): not a trial of the search")
    return Named(named.name, plan, sets, True)
