"""``[nuisance]``: settings tuned for each variant before its seeds run, so that no shape is
compared at a learning rate that suits another.

    [nuisance]
    selection = { "task.validation" = "fraction:0.1" }   # how a tuning run's selection split
                                                         #   differs from the split reported
    extend = 2                                           # grid extensions allowed at an edge
    seeds = [1000, 1001]                                 # the tuning runs' seeds (the default)
    [nuisance.values]
    "optim.lr" = [1e-3, 3e-3, 1e-2]                      # optionally warm-up, weight decay, ...

Each variant runs at every point of the grid once per tuning seed, with ``selection`` applied, so
the value is chosen on held-out data that is not the split the report compares on. A point's
selection value is the mean over the tuning seeds (a point that diverged on any seed counts as
diverged): one seed's noise, or the thread count's effect on one seed, can flip a choice between
two grid points. The tuning seeds are never the study's own (``0 .. seeds-1``), so no run a
verdict compares is a grid's winner: a winner is optimistic on its own seed. When the best
value sits at the edge of an axis the axis is extended one step beyond it (geometrically for
positive values), up to ``extend`` times; the report says when the choice is still at an edge.
Then every seed of the variant runs at its own best value. Cost per variant: the grid (plus any
extensions) and the seeds.

Before anything runs, :func:`check_tuning` refuses a ``[nuisance]`` that cannot tune a variant:
a grid point whose run config ``headwise train`` would refuse, a selection that leaves a key as
the variant's runs already have it, a key both tuned and selected, a metric the runs do not report.

The tuning runs live under ``STUDY_DIR/tuning/`` and resume like any run; the choice is derived
from their summaries each time the study runs, and written to ``tuning/tuning.json``.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from headwise.config import Config, atomic_write_text, set_dotted
from headwise.errors import HeadwiseError, RunFailure
from headwise.run import RunStatus, read_summary
from headwise.study.claims import metric_problem
from headwise.train.config import RunConfig, resolve_run_model

TUNING_DIR = "tuning"
TUNING_JSON = "tuning.json"
#: far above any study's seed count, so that adding seeds to a study never reaches them
DEFAULT_SEEDS = (1000, 1001)


class Nuisance(Config):
    """The settings tuned per variant, and how."""

    #: dotted run-config key -> the values tried (numbers)
    values: dict[str, list[float]] = Field(min_length=1)
    #: keys set on the tuning runs only: their selection split (must not be the reported one)
    selection: dict[str, Any] = Field(min_length=1)
    #: "loss" (the final eval loss) or a key of the runs' eval metrics
    metric: str = "loss"
    better: Literal["lower", "higher"] = "lower"
    #: how many times an axis may be extended past an edge
    extend: int = Field(default=2, ge=0)
    #: the tuning runs' seeds, at least two, none of them a seed the study reports (0 .. seeds-1)
    seeds: list[int] = Field(default_factory=lambda: list(DEFAULT_SEEDS), min_length=2)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or min(v) < 0:
            raise ValueError(f"nuisance seeds {v}: give distinct seeds >= 0")
        return sorted(v)

    @field_validator("values")
    @classmethod
    def _grids(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for key, values in v.items():
            if len(values) < 3:
                raise ValueError(f"nuisance {key!r}: give at least three values, so that the best can lie inside")
            if len(set(values)) != len(values):
                raise ValueError(f"nuisance {key!r}: values repeat")
        return {k: sorted(float(x) for x in vals) for k, vals in v.items()}


Point = tuple[tuple[str, float], ...]


def label(point: Point) -> str:
    """A directory-safe name of a grid point: ``lr0.003`` (the last part of each key)."""
    return "-".join(f"{key.rsplit('.', 1)[-1]}{value:g}" for key, value in point)


def grid(axes: dict[str, list[float]]) -> list[Point]:
    """Every point of the product of the axes."""
    keys = sorted(axes)
    return [tuple(zip(keys, combo)) for combo in product(*(axes[k] for k in keys))]


def beyond(values: list[float], low_edge: bool) -> float:
    """The next value past an edge of sorted ``values``: the same ratio as the last step when
    every value is positive (a log-spaced grid such as learning rates), else the same step."""
    a, b = (values[1], values[0]) if low_edge else (values[-2], values[-1])
    # rounded to 12 digits, so that 0.1 * 0.1 / 0.01 names the run "lr1", not 1.0000000000000002
    return float(f"{(b * b / a if values[0] > 0 else b + (b - a)):.12g}")


def reachable(values: list[float], extend: int) -> list[float]:
    """The values past the edges of sorted ``values`` that ``extend`` extensions can reach at the
    farthest (none when ``extend`` is 0): the last of each edge's steps (see :func:`beyond`)."""
    if extend == 0:
        return []
    low, high = list(values), list(values)
    for _ in range(extend):
        low, high = [beyond(low, low_edge=True), *low], [*high, beyond(high, low_edge=False)]
    return [low[0], high[-1]]


def overlapping_seeds(nuisance: Nuisance | None, study_seeds: int) -> list[int]:
    """The tuning seeds that are also seeds the study reports (``0 .. study_seeds-1``)."""
    return [] if nuisance is None else [s for s in nuisance.seeds if s < study_seeds]


def tuning_config(config: dict[str, Any], nuisance: Nuisance, point: Point, seed: int) -> dict[str, Any]:
    """A variant's run config for one tuning run: the point's values, the selection keys and the seed."""
    cfg = copy.deepcopy(config)
    for key, value in [*point, *nuisance.selection.items(), ("train.seed", seed)]:
        set_dotted(cfg, key, value)
    return cfg


def check_tuning(nuisance: Nuisance, variant: str, config: dict[str, Any]) -> None:
    """Refuse a ``[nuisance]`` that cannot tune ``variant`` (its run config ``config``), before
    any run: see the module docstring. Each refusal names the key and value at fault."""
    both = sorted(set(nuisance.values) & set(nuisance.selection))
    if both:
        raise HeadwiseError(f"[nuisance] {both[0]} is both tuned (values) and set by selection, which would "
                            "overwrite every value tried: tune it or select with it, not both")
    seed = nuisance.seeds[0]
    try:
        tuned = RunConfig.parse(tuning_config(config, nuisance, (), seed), source="[nuisance] selection")
    except HeadwiseError as exc:
        raise HeadwiseError(f"variant {variant!r}: {exc}") from None
    ran, selected = RunConfig.parse(config, source="run config").to_dict(), tuned.to_dict()
    for key, value in nuisance.selection.items():
        if _dotted(selected, key) == _dotted(ran, key):
            raise HeadwiseError(f"[nuisance] selection {key} = {value!r} is what variant {variant!r}'s runs have "
                                "already, so tuning would choose on the data the report compares on: select on "
                                "other data (another eval split, a hold-out of the training data)")
    # every grid point, then each value an extension past an edge may reach: one that no run
    # accepts would fail the study midway, on every rerun
    middle = {key: values[len(values) // 2] for key, values in nuisance.values.items()}
    points = [(p, ", ".join(f"{key} = {value:g}" for key, value in p), "") for p in grid(nuisance.values)]
    points += [(tuple(sorted({**middle, key: value}.items())), f"{key} may be extended to {value:g} (extend = "
                f"{nuisance.extend}), which", "; move the grid away from that bound or lower extend")
               for key, values in nuisance.values.items() for value in reachable(values, nuisance.extend)]
    for point, what, hint in points:
        try:
            resolve_run_model(tuning_config(config, nuisance, point, seed), source="tuning run config")
        except HeadwiseError as exc:
            raise HeadwiseError(f"[nuisance] values: {what} does not make a run of variant {variant!r}: "
                                f"{exc}{hint}") from None
    problem = metric_problem(nuisance.metric, tuned.task)
    if problem:
        raise HeadwiseError(f"[nuisance] metric {nuisance.metric!r}: {problem}")


def report_split(nuisance: Nuisance, config: dict[str, Any]) -> dict[str, Any]:
    """The selection keys at the values the variant's own runs have (run config ``config``): what
    scores a tuning run on the split the report compares on."""
    ran = RunConfig.parse(config, source="run config").to_dict()
    return {key: _dotted(ran, key) for key in nuisance.selection}


def _dotted(table: dict[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of a nested dict (None where it is not set)."""
    for part in key.split("."):
        table = table.get(part) if isinstance(table, dict) else None
    return table


def selection_value(run_dir: Path, nuisance: Nuisance) -> float | None:
    """The tuning run's selection metric, once it has completed (None otherwise)."""
    s = read_summary(run_dir)
    if s is None or s.status is not RunStatus.COMPLETED:
        return None
    value = s.final_eval_loss if nuisance.metric == "loss" else s.eval_metrics.get(nuisance.metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def mean_selection_value(values: list[float | None]) -> float | None:
    """A grid point's selection value: the mean over its tuning seeds, None when any of them
    diverged (an unstable setting loses, however well its other seeds did)."""
    if not values or any(v is None for v in values):
        return None
    return float(sum(values) / len(values))  # type: ignore[arg-type]


@dataclass
class Choice:
    """What tuning chose for one variant."""

    variant: str
    #: label -> (the point as {key: value}, its mean selection value over the tuning seeds; None
    #: for a point that diverged on some seed)
    tried: dict[str, tuple[dict[str, float], float | None]]
    #: the chosen point; None while tuning is unfinished, or when no tuning run completed
    best: dict[str, float] | None
    #: the keys whose chosen value is still at the edge of what was tried
    at_edge: list[str]
    extensions: dict[str, int]
    #: the tuning runs' seeds ([0] in studies tuned before tuning seeds were kept apart)
    seeds: list[int] = field(default_factory=lambda: [0])
    #: label -> the mean over the tuning seeds of the same metric on the split the report compares
    #: on (None where a seed diverged): how well tuning predicts the evaluation (see
    #: :func:`agreement`); empty in studies tuned before it was measured
    evaluated: dict[str, float | None] = field(default_factory=dict)


def choose(variant: str, axes: dict[str, list[float]], done: set[Point], values: dict[Point, float],
           nuisance: Nuisance, extensions: dict[str, int]) -> tuple[Choice, list[Point]]:
    """What tuning knows so far, and the points still to run.

    ``done`` are the grid points whose runs have finished on every tuning seed (completed or
    diverged), ``values`` the mean selection values of those that completed on every seed. While points of the grid are unfinished they are
    what is left to run; once all have finished, an axis whose best value sits at its edge grows
    one step past it (while ``extensions`` allow; ``axes`` and ``extensions`` change in place)
    and the new points are left to run; otherwise the best point is the choice."""
    tried = {label(p): (dict(p), values.get(p)) for p in grid(axes) if p in done}
    pending = [p for p in grid(axes) if p not in done]
    sign = 1.0 if nuisance.better == "lower" else -1.0
    seeds = list(nuisance.seeds)
    if pending or not values:
        return Choice(variant, tried, None, [], dict(extensions), seeds), pending
    best = min(values, key=lambda p: sign * values[p])
    chosen, at_edge, grew = dict(best), [], False
    for key, axis in axes.items():
        if chosen[key] not in (axis[0], axis[-1]):
            continue
        if extensions.get(key, 0) >= nuisance.extend:
            at_edge.append(key)
            continue
        axes[key] = sorted([*axis, beyond(axis, low_edge=chosen[key] == axis[0])])
        extensions[key] = extensions.get(key, 0) + 1
        grew = True
    if grew:
        return Choice(variant, tried, None, [], dict(extensions), seeds), [p for p in grid(axes) if p not in done]
    return Choice(variant, tried, chosen, at_edge, dict(extensions), seeds), []


@dataclass(frozen=True)
class Agreement:
    """How a variant's tuning agrees with the evaluation, over the points both scored."""

    variant: str
    #: the point tuning chose and the one the report's split would have chosen (labels)
    chosen: str
    evaluation_best: str
    #: how much worse the chosen point is than the evaluation's best, on the report's split (>= 0)
    regret: float
    #: Spearman's rank correlation of the selection and evaluation values (None under 3 points)
    spearman: float | None


def _scored(choice: Choice) -> dict[str, tuple[float, float]]:
    return {name: (value, choice.evaluated[name]) for name, (_, value) in choice.tried.items()
            if value is not None and choice.evaluated.get(name) is not None}


def rank_correlation(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation of (selection, evaluation) pairs; None under 3 pairs or when
    either side is constant."""
    from scipy.stats import spearmanr

    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return None
    return float(spearmanr([a for a, _ in pairs], [b for _, b in pairs]).statistic)


def agreement(choice: Choice, nuisance: Nuisance) -> Agreement | None:
    """The variant's :class:`Agreement`, or None before its choice or its evaluation scores exist."""
    scored = _scored(choice)
    if choice.best is None or not scored:
        return None
    chosen = label(tuple(sorted(choice.best.items())))
    if chosen not in scored:
        return None
    sign = 1.0 if nuisance.better == "lower" else -1.0
    best = min(scored, key=lambda name: sign * scored[name][1])
    return Agreement(choice.variant, chosen, best, sign * (scored[chosen][1] - scored[best][1]),
                     rank_correlation(list(scored.values())))


def pooled_agreement(choices: list[Choice]) -> float | None:
    """Spearman's rank correlation over every variant's scored points together: whether tuning
    orders the variants and their settings as the evaluation does."""
    return rank_correlation([pair for c in choices for pair in _scored(c).values()])


def write_choices(study_dir: Path, choices: list[Choice]) -> Path:
    """``tuning/tuning.json``: every variant's tried points, their values and the choice."""
    path = Path(study_dir) / TUNING_DIR / TUNING_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps([asdict(c) for c in choices], indent=1))
    return path


def read_choices(study_dir: Path) -> list[Choice]:
    """The choices a study's tuning made (none when it declared no nuisance settings); a
    ``tuning.json`` that cannot be read back is a RunFailure naming it."""
    path = Path(study_dir) / TUNING_DIR / TUNING_JSON
    if not path.is_file():
        return []
    try:
        return [Choice(**{**c, "tried": {k: (p, v) for k, (p, v) in c["tried"].items()}})
                for c in json.loads(path.read_text(encoding="utf-8"))]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # cut, garbled or not the format
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunFailure(f"{path} is damaged ({why}): rerun the study (`headwise study` with its study file) "
                         "to rewrite it from the tuning runs") from None
