"""The search's Optuna study: its storage, sampler and pruner.

The store is an :class:`optuna.storages.RDBStorage`: by default a SQLite file inside the search
folder (``optuna.db``), else any database URL ``--storage`` names, so that several drivers
(``headwise search ... --worker``) share one search. The study in it is named ``headwise-search``
and carries the search's fingerprint, so a store holding another search under that name is
refused rather than mixed.

Sampling is reproducible: trial n samples with a sampler made afresh with seed ``seed + n``
(:class:`PerTrialSeed`), so what it draws depends only on the search's seed, its number and the
trials finished before it, never on how many times a driver was started. One objective samples
with multivariate TPE, several with NSGA-II.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna

from headwise.errors import HeadwiseError
from headwise.search.definition import Search
from headwise.search.record import STUDY_NAME


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


class PerTrialSeed(optuna.samplers.BaseSampler):
    """A sampler that makes a fresh inner sampler, seeded ``seed + trial number``, for each trial
    (Optuna calls :meth:`before_trial` when a trial is created or taken up again)."""

    def __init__(self, make: Callable[[int], Any], seed: int) -> None:
        self._make, self._seed = make, seed
        self._inner = make(seed)

    def before_trial(self, study: Any, trial: Any) -> None:
        self._inner = self._make(self._seed + trial.number)
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self._inner.sample_independent(study, trial, name, distribution)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._inner.after_trial(study, trial, state, values)


def make_sampler(search: Search) -> Any:
    """TPE (multivariate, grouped: the layers present depend on the depth) for one objective,
    NSGA-II for several; each trial's made with its own seed."""
    optuna = _optuna()
    if len(search.config.objectives) > 1:
        # NSGA-II's default generation of 50 would leave a search of a few dozen trials random:
        # about a quarter of the trials per generation gives it several (at least 4 each)
        population = max(4, min(50, search.config.trials // 4))
        make = lambda seed: optuna.samplers.NSGAIISampler(seed=seed, population_size=population)  # noqa: E731
    else:
        make = lambda seed: optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed)  # noqa: E731
    return PerTrialSeed(make, search.config.seed)


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
        study.set_user_attr("fingerprint", search.fingerprint())
        study.set_user_attr("search", search.name)
        study.set_user_attr("objectives", [o.metric for o in search.config.objectives])
    check_store(search, storage, name)  # another driver may have made it meanwhile
    return study
