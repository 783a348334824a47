"""The search's Optuna study: its storage, sampler and pruner.

The store is an :class:`optuna.storages.RDBStorage`: by default a SQLite file inside the search
folder (``optuna.db``), else any database URL ``--storage`` names, so that several drivers
(``headwise search ... --worker``) share one search. The study in it is named ``headwise-search``
and carries the search's fingerprint, so a store holding another search under that name is
refused rather than mixed.

Sampling is reproducible: trial n samples with a sampler made afresh with seed ``seed + n``
(:class:`PlanSampler`), so what it draws depends only on the search's seed, its number and the
trials finished before it, never on how many times a driver was started. One objective samples
with multivariate TPE, several with NSGA-II, unless the search file names its ``sampler``
(``random`` too). Each parameter is a value of the plan over a range that is the same in every
trial (:func:`draw`), repaired as it is drawn to the nearest value that still leads to a plan
within the budget (:meth:`~headwise.search.space.PlanSpace.repair`), so the params Optuna stores
(and ``study.trials_dataframe()`` shows) are the plan's.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.search.definition import LR, Search
from headwise.search.record import STUDY_NAME
from headwise.search.space import on_log_scale


#: what a trial's params are, kept in the study: the plan's values (an earlier headwise stored
#: numbers in [0, 1] that picked among the values still feasible, which this one cannot read)
PARAMETERS = "values"


def _optuna() -> Any:
    optuna.logging.set_verbosity(logging.WARNING)
    # TPE's `group` is marked experimental; the search depends on it knowingly
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def open_storage(url: str, own: Path | None = None) -> Any:
    """The RDB storage at ``url``; a URL that does not open is one line (HeadwiseError): a
    missing database driver is named with the package to install, and ``own`` (the search
    folder's ``optuna.db``, which ``url`` names when no --storage was given) is called damaged."""
    optuna = _optuna()
    check_driver(url)
    # several drivers write one SQLite file: wait for its lock rather than fail at once
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy, the drivers and Optuna raise many kinds
        detail = f"{type(exc).__name__}: " + (" ".join(str(exc).split())[:200] or type(exc).__name__)
        if own is not None:
            raise HeadwiseError(f"{own} is damaged: the search's Optuna store does not open ({detail}); restore it, "
                                "or pass --new to start the search afresh (its files move into previous-N/)") from None
        raise HeadwiseError(f"--storage {url} does not open ({detail}); give a database URL such as "
                            "sqlite:////abs/path/optuna.db") from None


def check_driver(url: str) -> None:
    """Refuse a database URL whose driver module is not installed, naming it (Optuna's own message
    suggests an SQLite URL instead); PostgreSQL's is headwise's ``postgres`` extra (psycopg 3,
    SQLAlchemy's driver for ``postgresql://``)."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(url).get_dialect()
    except Exception:  # noqa: BLE001 - a malformed URL or an unknown kind: RDBStorage says which
        return
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        missing = exc.name or dialect.driver
        fix = ("pip install -e '.[postgres]' (psycopg 3) and give a postgresql:// URL" if dialect.name == "postgresql"
               else f"install the Python package that provides {missing}")
        raise HeadwiseError(f"--storage {url} needs the database driver {missing!r}, which is not installed: "
                            f"{fix}") from None


class PlanSampler(optuna.samplers.BaseSampler):
    """The search's sampler: a fresh inner sampler (TPE, NSGA-II, random), seeded ``seed + trial
    number``, for each trial (Optuna calls :meth:`before_trial` when a trial is made or taken up
    again), and every value it proposes repaired by ``repair(params so far, name, value)`` before
    Optuna stores it. The inner sampler's joint proposal (``sample_relative``) is held and handed
    out one parameter at a time, in the order the trial draws them, so that each is repaired
    knowing the values before it; :attr:`repairs` keeps, per trial, what was proposed for each
    value repaired. Each trial keeps its own inner sampler and proposal until it ends, so trials
    asked before earlier ones have drawn still draw as they would alone."""

    def __init__(self, make: Callable[[int], Any], seed: int, repair: Callable[[dict[str, Any], str, Any], Any]) -> None:
        self._make, self._seed, self._repair = make, seed, repair
        self._inner: dict[int, Any] = {}
        self._proposal: dict[int, dict[str, Any]] = {}
        self.repairs: dict[int, dict[str, Any]] = {}

    def _of(self, trial: Any) -> Any:
        if trial.number not in self._inner:
            self._inner[trial.number] = self._make(self._seed + trial.number)
        return self._inner[trial.number]

    def before_trial(self, study: Any, trial: Any) -> None:
        self._inner.pop(trial.number, None)  # taken up again: afresh, as when it was made
        self._of(trial).before_trial(study, trial)

    def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        # held, not returned: Optuna would store what is returned as it is
        self._proposal[trial.number] = self._of(trial).sample_relative(study, trial, search_space)
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        proposal = self._proposal.get(trial.number, {})
        value = proposal[name] if name in proposal else self._of(trial).sample_independent(study, trial, name,
                                                                                           distribution)
        repaired = self._repair(trial.params, name, value)
        if repaired != value:
            self.repairs.setdefault(trial.number, {})[name] = value
        return repaired

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._of(trial).after_trial(study, trial, state, values)
        self._inner.pop(trial.number, None)
        self._proposal.pop(trial.number, None)


def make_sampler(search: Search) -> Any:
    """The search's :class:`PlanSampler` around its sampler kind: TPE (multivariate, grouped: the
    layers present depend on the depth), NSGA-II or random; each trial's made with its own seed."""
    optuna = _optuna()
    kind = search.config.sampler_kind
    if kind == "nsga2":
        # NSGA-II's default generation of 50 would leave a search of a few dozen trials random:
        # about a quarter of the trials per generation gives it several (at least 4 each)
        population = max(4, min(50, search.config.trials // 4))
        make = lambda seed: optuna.samplers.NSGAIISampler(seed=seed, population_size=population)  # noqa: E731
    elif kind == "tpe":
        make = lambda seed: optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed)  # noqa: E731
    else:
        make = lambda seed: optuna.samplers.RandomSampler(seed=seed)  # noqa: E731
    return PlanSampler(make, search.config.seed, search.space.repair)


def suggest(trial: Any, name: str, choices: list[Any]) -> Any:
    """Trial ``trial``'s value of parameter ``name`` over the range of ``choices`` (a list of values,
    sorted): whole numbers for whole values, on a log scale but for the depth."""
    low, high, log = choices[0], choices[-1], on_log_scale(name)
    if all(isinstance(c, int) for c in choices):
        return trial.suggest_int(name, low, high, log=log)
    return trial.suggest_float(name, float(low), float(high), log=log)


def draw(search: Search, trial: Any) -> tuple[Plan, float | None]:
    """Trial ``trial``'s plan and learning rate (None: the base's, when the space does not search
    it): sampled now, or read back from the store for a trial taken up again."""
    space = search.space
    plan = space.decode(lambda name: suggest(trial, name, space.choices(name)))
    return plan, suggest(trial, LR, space.config.lr) if space.config.lr else None


def make_pruner(search: Search) -> Any:
    """The pruner on the eval curve: successive halving or Hyperband, its first rung at
    ``min_steps`` (default: the base's eval interval), or none."""
    optuna = _optuna()
    fidelity = search.config.fidelity
    if fidelity.pruner == "none":
        return optuna.pruners.NopPruner()
    first = search.first_rung
    if fidelity.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=fidelity.reduction_factor)
    steps = int(search.base["train"]["steps"])
    return optuna.pruners.HyperbandPruner(min_resource=first, max_resource=steps,
                                          reduction_factor=fidelity.reduction_factor)


def check_store(search: Search, storage: Any, name: str = STUDY_NAME) -> None:
    """Refuse, writing nothing, a store whose study ``name`` holds another search (another
    fingerprint, or other directions); a store without that study is this search's to make."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return
    attrs = storage.get_study_user_attrs(study_id)
    saved = attrs.get("fingerprint")
    if saved is not None and saved != search.fingerprint():
        raise HeadwiseError(f"the store's study {name!r} holds another search ({attrs.get('search')!r}, "
                            "defined differently); use another --storage, or the other search's own command")
    if saved is not None and attrs.get("parameters") != PARAMETERS:
        raise HeadwiseError(f"the store's study {name!r} was made by an earlier headwise, whose trials' params are "
                            "numbers in [0, 1], not the plan's values: it cannot be taken up; pass --new to start "
                            "afresh (the earlier search moves into previous-N/), or resume it with that headwise")
    stored = [d.name.lower() for d in storage.get_study_directions(study_id)]
    directions = [o.direction for o in search.config.objectives]
    if stored != directions:
        raise HeadwiseError(f"the store's study {name!r} has directions {stored}, this search {directions}")


def open_study(search: Search, storage: Any, name: str = STUDY_NAME) -> Any:
    """The search's study in ``storage`` (made on first use), with its sampler and pruner; a
    study of that name holding another search is refused (:func:`check_store`)."""
    optuna = _optuna()
    check_store(search, storage, name)
    directions = [o.direction for o in search.config.objectives]
    try:
        study = optuna.create_study(storage=storage, study_name=name, directions=directions, load_if_exists=True,
                                    sampler=make_sampler(search), pruner=make_pruner(search))
    except ValueError as exc:  # e.g. the stored study's directions differ
        raise HeadwiseError(f"the store's study {name!r} is not this search's ({exc})") from None
    if study.user_attrs.get("fingerprint") is None:
        study.set_user_attr("parameters", PARAMETERS)
        study.set_user_attr("fingerprint", search.fingerprint())
        study.set_user_attr("search", search.name)
        study.set_user_attr("objectives", [o.metric for o in search.config.objectives])
    check_store(search, storage, name)  # another driver may have made it meanwhile
    return study
