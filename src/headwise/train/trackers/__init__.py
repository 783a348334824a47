"""Experiment trackers: where a run's config, metrics, summary and figures go besides its own files.

A run's ``[log] trackers`` names them (:class:`LogConfig`); each is a
:class:`Tracker` registered in :data:`TRACKERS` under its name by a module of this package (found
by listing the package on the first lookup), so a new one is a module here, with nothing else
branching on the name. Each backend is an optional extra: a tracker whose package is missing is
refused, before the run writes anything, with one line naming the extra to install.

- ``tensorboard`` (:mod:`~headwise.train.trackers.tensorboard`): events in the run's ``tb/``;
- ``wandb`` (:mod:`~headwise.train.trackers.wandb`): a W&B run, its files in the run's ``wandb/``;
- ``mlflow`` (:mod:`~headwise.train.trackers.mlflow`): an MLflow run in the experiment
  ``log.project``, by default in a file store ``mlruns/`` in the run's directory.

A study groups its runs: before they start, :func:`open_group` gives each tracker the chance to
set up the study's own record (W&B: the group name; MLflow: a parent run in a store under the
study directory) and returns the ``[log]`` keys every run gets; :func:`close_group` puts the
report's figures there (W&B: a run of job type ``report`` in the group; MLflow: artifacts of the
parent run; TensorBoard: images in the study's ``tb/``).
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import field_validator

from headwise.config import Config, atomic_write_text
from headwise.errors import HeadwiseError, RunFailure
from headwise.registry import Registry

#: the trackers' ids in a run's (or a study's) directory, so that a resume continues the same record
IDS_FILE = "trackers.json"


def _require(module: str, tracker: str, extra: str) -> Any:
    """Import an optional package, or refuse with the one line saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HeadwiseError(f"log.trackers names {tracker!r}, which needs the {extra} extra: "
                            f'pip install -c requirements.lock -e ".[{extra}]"') from None


def numbers(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a row or summary (top level only; None, text and tables left out)."""
    return {k: v for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def read_ids(directory: Path) -> dict[str, str]:
    """The tracker ids kept in a run's or a study's directory (tracker name -> id)."""
    path = Path(directory) / IDS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: a new record is started
        return {}


def save_id(directory: Path, name: str, value: str) -> None:
    """Keep one tracker's id in a run's or a study's directory."""
    ids = read_ids(directory)
    ids[name] = value
    atomic_write_text(Path(directory) / IDS_FILE, json.dumps(ids, indent=2) + "\n")


class Tracker:
    """One backend for one run. Made (package imported, nothing written) before the run touches
    its directory; then :meth:`start`, :meth:`log_metrics` per logged step, :meth:`log_summary`,
    :meth:`log_figures`, :meth:`finish`. The classmethods serve a study's own record."""

    name: ClassVar[str]
    #: the module it needs and the extra that installs it
    package: ClassVar[str]
    extra: ClassVar[str]

    def __init__(self, log: LogConfig, run_dir: Path) -> None:
        self.log, self.run_dir = log, Path(run_dir)
        self.module = self.require()

    @property
    def run_name(self) -> str:
        """The run's name in the tracker: ``log.name``, else its directory's name."""
        return self.log.name or self.run_dir.name

    @classmethod
    def require(cls) -> Any:
        """The backend's module; a HeadwiseError naming the extra when it is not installed."""
        return _require(cls.package, cls.name, cls.extra)

    def start(self, config: dict[str, Any], resume_step: int | None) -> None:
        """Open the record with the resolved run config; ``resume_step``: the checkpoint's step
        when the run resumes (None for a new run)."""

    def log_metrics(self, row: dict[str, Any], step: int) -> None:
        """One metrics row (a line of ``metrics.jsonl``)."""

    def log_summary(self, summary: dict[str, Any]) -> None:
        """The run's summary (``summary.json``) as it ended."""

    def log_figures(self, paths: list[Path]) -> None:
        """Figure files (PNG)."""

    def finish(self, status: str) -> None:
        """Close the record; ``status`` is the run's (completed, interrupted, diverged, failed)."""

    @classmethod
    def open_group(cls, log: LogConfig, study_dir: Path, group: str) -> dict[str, Any]:
        """Set up a study's record (once per study; again on a rerun, reusing it) and return the
        ``[log]`` keys its runs need to join it."""
        return {}

    @classmethod
    def close_group(cls, log: LogConfig, study_dir: Path, ok: bool) -> None:
        """The study's runs have ended (``ok``: all of them completed)."""

    @classmethod
    def log_group_figures(cls, log: LogConfig, study_dir: Path, group: str, paths: list[Path]) -> None:
        """Put a study report's figures in the study's record."""


def _import_trackers() -> None:
    # every module of this package registers one tracker on import
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


#: tracker name -> class
TRACKERS: Registry[type[Tracker]] = Registry("tracker", discover=_import_trackers)


def register(cls: type[Tracker]) -> type[Tracker]:
    """Make a tracker available to ``[log] trackers`` under its ``name``."""
    return TRACKERS.register(cls.name, cls)


class LogConfig(Config):
    """``[log]``: the experiment trackers a run's metrics also go to (``metrics.jsonl`` and
    ``summary.json`` are always written).

    ``trackers`` unset means TensorBoard when it is installed and nothing otherwise (so a run
    without the extra still trains); a tracker named explicitly must be installed, else the run
    is refused before it starts. ``[]`` turns them all off."""

    trackers: list[str] | None = None
    #: the W&B project and the MLflow experiment
    project: str = "headwise"
    #: the run's name in the trackers; None: its directory's name (a study sets ``variant/seedN``)
    name: str | None = None
    #: the W&B group of a study's runs (the study sets it)
    group: str | None = None
    #: "online", "offline" or "disabled"; None: W&B's own choice (WANDB_MODE, else online)
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    #: None: MLFLOW_TRACKING_URI, else a file store in the run's (or its study's) directory
    mlflow_uri: str | None = None
    #: the MLflow run a study's runs are nested under (the study sets it)
    mlflow_parent: str | None = None

    @field_validator("trackers")
    @classmethod
    def _known(cls, names: list[str] | None) -> list[str] | None:
        for name in names or ():
            if name not in TRACKERS:
                raise ValueError(f"unknown tracker {name!r}; known trackers: {', '.join(sorted(TRACKERS))}")
        if names is not None and len(set(names)) != len(names):
            raise ValueError("a tracker is named twice")
        return names


def open_trackers(log: LogConfig, run_dir: Path) -> list[Tracker]:
    """The run's trackers, made (packages imported, nothing written). Unset ``log.trackers``
    means TensorBoard if installed; a tracker named explicitly and not installed is a
    HeadwiseError naming its extra."""
    if log.trackers is None:
        try:
            return [TRACKERS["tensorboard"](log, run_dir)]
        except HeadwiseError:  # the default, not asked for: a run without the extra still trains
            return []
    return [TRACKERS[name](log, run_dir) for name in log.trackers]


def check_trackers(log: LogConfig) -> None:
    """Refuse (HeadwiseError, one line) a tracker ``log.trackers`` names whose package is missing."""
    for name in log.trackers or ():
        TRACKERS[name].require()


def open_group(log: LogConfig, study_dir: Path, group: str) -> dict[str, Any]:
    """Set up a study's record in each tracker ``log.trackers`` names; returns the ``[log]`` keys
    its runs get (none when it names no tracker). RunFailure when a backend fails."""
    if not log.trackers:
        return {}
    keys: dict[str, Any] = {"group": group}
    for name in log.trackers:
        try:
            keys.update(TRACKERS[name].open_group(log, study_dir, group))
        except HeadwiseError:
            raise
        except Exception as exc:  # a backend's own error (store unreachable, ...): the line names it
            raise RunFailure(f"tracker {name} could not set up the study's record: "
                             f"{type(exc).__name__}: {exc}") from None
    return keys


def close_group(log: LogConfig, study_dir: Path, ok: bool, group: str, figures: list[Path]) -> list[str]:
    """After a study's runs (and report): put the report's ``figures`` in each tracker's study
    record and close it. A tracker that fails is skipped, since the runs and the report are on
    disk already; returns one line per failure."""
    problems = []
    for name in log.trackers or ():
        tracker = TRACKERS[name]
        try:
            if figures:
                tracker.log_group_figures(log, study_dir, group, figures)
            tracker.close_group(log, study_dir, ok)
        except Exception as exc:  # noqa: BLE001 - any backend's failure; the line names it
            problems.append(f"tracker {name}: {type(exc).__name__}: {exc}")
    return problems


def warn(text: str) -> None:
    """One warning line on stderr."""
    print(f"warning: {text}", file=sys.stderr, flush=True)
