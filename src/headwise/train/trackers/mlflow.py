"""``mlflow``: an MLflow run in the experiment ``log.project``, tracked at ``log.mlflow_uri``, else
``MLFLOW_TRACKING_URI``, else a file store ``mlruns/`` in the run's directory (the
``mlflow-skinny`` package has no SQL store without SQLAlchemy; its file store is allowed here).
MLflow cannot delete logged values: a run killed after its last checkpoint and resumed has two
values at the steps it logs again (the later ones are the resumed run's; ``metrics.jsonl`` keeps
only those). A study's runs are nested under a parent run, which holds the report's figures."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from headwise.config import flatten
from headwise.errors import HeadwiseError, RunFailure
from headwise.model.pretrained import first_line
from headwise.paths import nearest_existing
from headwise.train.trackers import IDS_FILE, Tracker, numbers, read_ids, register, save_id, warn

if TYPE_CHECKING:
    from headwise.train.config import LogConfig

MLFLOW_DIR = "mlruns"


@register
class MlflowTracker(Tracker):
    """An MLflow run in the experiment ``log.project``: the config as parameters, metrics per
    step, the summary's numbers as ``summary.*`` metrics plus ``summary.json``, figures as
    artifacts; nested under ``log.mlflow_parent`` when a study set one. The run id is kept in
    the run's ``trackers.json``, so a resumed run continues the same MLflow run."""

    name = extra = "mlflow"
    package = "mlflow.tracking"
    #: MLflow's limit on the parameters of one log_batch call
    BATCH = 100

    def __init__(self, log: LogConfig, run_dir: Path) -> None:
        super().__init__(log, run_dir)
        self.client: Any = None  # made in start(): making one creates a file store's directory
        self.run_id: str | None = None
        self.step = 0
        _check_mlflow(log, run_dir)

    def start(self, config: dict[str, Any], resume_step: int | None) -> None:
        try:
            self._start(config, resume_step)
        except Exception as exc:  # MLflow's own errors (store unreachable, unsupported URI): the run cannot log
            raise RunFailure(f"MLflow could not start a run at {_mlflow_uri(self.log, self.run_dir)} "
                             f"({type(exc).__name__}: {exc})") from None

    def _start(self, config: dict[str, Any], resume_step: int | None) -> None:
        self.client = _mlflow_client(self.log, self.run_dir)
        run_id = read_ids(self.run_dir).get(self.name) if resume_step is not None else None
        run_id = _existing_run(self.client, run_id, self.log, self.run_dir)
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
        else:
            tags = {"mlflow.parentRunId": self.log.mlflow_parent} if self.log.mlflow_parent else {}
            run = self.client.create_run(_experiment(self.client, self.log.project), run_name=self.run_name,
                                         tags=tags)
            run_id = run.info.run_id
            save_id(self.run_dir, self.name, run_id)
            # Parameters cannot change once logged, so only a new run logs them.
            from mlflow.entities import Param

            params = [Param(k, str(v)) for k, v in flatten(config).items()]
            for i in range(0, len(params), self.BATCH):
                self.client.log_batch(run_id, params=params[i:i + self.BATCH])
        self.run_id, self.step = run_id, resume_step or 0

    def log_metrics(self, row: dict[str, Any], step: int) -> None:
        self.step = step
        self._metrics({k: v for k, v in numbers(row).items() if k != "step"}, step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._metrics({f"summary.{k}": v for k, v in numbers(summary).items()}, self.step)
        self.client.log_dict(self.run_id, summary, "summary.json")

    def log_figures(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), "figures")

    def finish(self, status: str) -> None:
        state = {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, state)

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    @classmethod
    def open_group(cls, log: LogConfig, study_dir: Path, group: str) -> dict[str, Any]:
        """A parent run named after the study (made once, its id kept in the study's
        ``trackers.json``), in the study's store unless ``log.mlflow_uri`` names another."""
        uri = _mlflow_uri(log, study_dir)
        client = _mlflow_client(log, study_dir)
        parent = _existing_run(client, read_ids(study_dir).get(cls.name), log, study_dir)
        if parent is None:
            run = client.create_run(_experiment(client, log.project), run_name=group, tags={"headwise.study": group})
            parent = run.info.run_id
            save_id(study_dir, cls.name, parent)
        else:
            client.update_run(parent, status="RUNNING")
        return {"mlflow_uri": uri, "mlflow_parent": parent}

    @classmethod
    def close_group(cls, log: LogConfig, study_dir: Path, ok: bool) -> None:
        parent = read_ids(study_dir).get(cls.name)
        if parent is not None:
            _mlflow_client(log, study_dir).set_terminated(parent, "FINISHED" if ok else "FAILED")

    @classmethod
    def log_group_figures(cls, log: LogConfig, study_dir: Path, group: str, paths: list[Path]) -> None:
        """The figures as artifacts of the study's parent run."""
        parent = read_ids(study_dir).get(cls.name)
        if parent is None:  # the study has not run with MLflow
            return
        tracker = cls(log, study_dir)
        tracker.client, tracker.run_id = _mlflow_client(log, study_dir), parent
        tracker.log_figures(paths)


def _mlflow_uri(log: LogConfig, directory: Path) -> str:
    return log.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or (Path(directory) / MLFLOW_DIR).resolve().as_uri()


def _local_store(uri: str) -> Path | None:
    """The folder of a file-store URI (``file:`` or a plain path); None for any other store."""
    if uri.startswith("file:"):
        return Path(url2pathname(urlparse(uri).path))
    return None if "://" in uri else Path(uri)


def _check_mlflow(log: LogConfig, run_dir: Path) -> None:
    """Refuse, before the run writes anything, what MLflow would fail on once it has started: an
    empty experiment name, a file store where a file is, a URI of a kind MLflow does not track to."""
    if not log.project:
        raise HeadwiseError("log.project is empty: MLflow names the run's experiment after it; give a name "
                            '(default "headwise")')
    uri = _mlflow_uri(log, run_dir)
    where = (f"log.mlflow_uri {uri}" if log.mlflow_uri else f"MLFLOW_TRACKING_URI {uri}"
             if os.environ.get("MLFLOW_TRACKING_URI") else f"the run's MLflow store {uri}")
    store = _local_store(uri)
    if store is not None:
        existing = nearest_existing(store)
        if not existing.is_dir():
            raise HeadwiseError(f"{where}: {existing} is a file; MLflow's file store is a folder: give a folder, or "
                                "a tracking server's http(s):// URI")
        return
    try:  # making a client of a remote store checks its URI and connects to nothing
        MlflowTracker.require().MlflowClient(uri)
    except Exception as exc:  # noqa: BLE001 - MLflow's own error for a URI it cannot use
        raise HeadwiseError(f"{where}: MLflow cannot track there ({first_line(exc)}); give a folder, or a "
                            "tracking server's http(s):// URI") from None


def _mlflow_client(log: LogConfig, directory: Path) -> Any:
    tracking = MlflowTracker.require()
    uri = _mlflow_uri(log, directory)
    if uri.startswith("file:") or "://" not in uri:
        # MLflow 3 refuses its file store unless asked (it wants a SQL store, which needs
        # SQLAlchemy, not part of mlflow-skinny); a local store is what we ask for here.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return tracking.MlflowClient(uri)


def _experiment(client: Any, name: str) -> str:
    """The id of the experiment ``name``, made if missing (two runs may race to make it)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # made by another run meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id



def _existing_run(client: Any, run_id: str | None, log: LogConfig, directory: Path) -> str | None:
    """``run_id`` when the store has that run; None (a new run is made, with one warning line)
    when ``trackers.json`` names a run the store does not hold: ``log.mlflow_uri`` or
    MLFLOW_TRACKING_URI now points at another store."""
    if run_id is None:
        return None
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
        return run_id
    except MlflowException:
        warn(f"MLflow run {run_id} (in {Path(directory) / IDS_FILE}) is not in the store at "
             f"{_mlflow_uri(log, directory)}: logging to a new MLflow run")
        return None

