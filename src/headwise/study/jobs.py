"""One run of a study as a job: its paths, what to do with its directory (start, resume,
restart or nothing), the jobs of a study and of its stages, and the progress lines and results.csv
updates as jobs end; shared by the local runner, the Ray backend and the nuisance tuning."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import tomli_w

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.run import RunStatus, read_summary
from headwise.study import layout
from headwise.study.definition import RunSpec, Study
from headwise.study.layout import StudyRecord
from headwise.study.results import update_results
from headwise.study.stages import Stage, stage_config, stage_root
from headwise.train.checkpoint import latest_checkpoint

#: seconds a run gets to checkpoint and exit when its study or search is interrupted
GRACE_S = 60.0

#: Statuses a rerun leaves alone.
FINAL = (RunStatus.COMPLETED, RunStatus.DIVERGED)


@dataclass
class RunJob:
    """One run to execute, with its paths and how to start it."""

    spec: RunSpec
    run_dir: Path
    config_path: Path
    log_path: Path
    lock_path: Path
    #: "start", "resume" or "restart"
    action: str
    #: the ``[[stages]]`` entry this run belongs to ("": a run of the study itself)
    stage: str = ""

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def title(self) -> str:
        """How progress lines and trackers name the run: its key, after its stage's name."""
        return f"{self.stage}/{self.key}" if self.stage else self.key

    def argv(self) -> list[str]:
        """Arguments after ``python``: the worker, its lock, then the ``headwise train`` command."""
        flag = {"start": [], "resume": ["--resume"], "restart": ["--overwrite"]}[self.action]
        return ["-m", "headwise.study.worker", str(self.lock_path), "--",
                "train", str(self.config_path), "--out", str(self.run_dir), *flag]

    def write_inputs(self) -> None:
        """Write the run's config and make the folders of its log, lock and run directory."""
        atomic_write_text(self.config_path, tomli_w.dumps(self.spec.config))
        for path in (self.log_path, self.lock_path, self.run_dir):
            path.parent.mkdir(parents=True, exist_ok=True)


def plan_action(run: Path) -> str | None:
    """What to do with one run directory: None (done), "start", "resume" (it holds a committed
    checkpoint, one ``checkpoints/latest`` names: a save cut short leaves only a temporary
    directory) or "restart"."""
    run = Path(run)
    if not run.exists() or not any(run.iterdir()):
        return "start"
    summary = read_summary(run)
    if summary is not None and summary.status in FINAL:
        return None
    try:
        return "resume" if latest_checkpoint(run) is not None else "restart"
    except HeadwiseError:  # `latest` names a missing checkpoint: --resume will say so
        return "resume"


def _unfinished(specs: list[RunSpec], root: Path) -> tuple[list[tuple[RunSpec, dict[str, Path], str]], list[str]]:
    """The runs ``specs`` under ``root`` that are not finished, each with its paths and action
    (:func:`plan_action`), and the keys of the finished ones."""
    pending, done = [], []
    for spec in specs:
        paths = layout.run_paths(root, spec.variant, spec.seed)
        action = plan_action(paths["run_dir"])
        if action is None:
            done.append(spec.key)
        else:
            pending.append((spec, paths, action))
    return pending, done


def plan_jobs(study: Study, study_dir: Path) -> tuple[list[RunJob], list[str]]:
    """Jobs for every run that is not finished, and the keys of the finished ones."""
    pending, done = _unfinished(study.runs(), study_dir)
    return [RunJob(spec=spec, action=action, **paths) for spec, paths, action in pending], done


def plan_stage_jobs(study: Study, study_dir: Path,
                    stage: Stage) -> tuple[list[RunJob], list[str], list[str], list[str]]:
    """Jobs for the stage's runs (from the runs of the variants it starts from) that are not
    finished and whose source runs have completed, and the keys of its finished runs, of those
    waiting for a source run that has not completed yet (it failed or was interrupted: a rerun
    retries it) and of those whose source diverged (they never run)."""
    pending, done = _unfinished([r for r in study.runs() if stage.runs_from(r.variant)],
                                stage_root(study_dir, stage.name))
    jobs, waiting, diverged = [], [], []
    for spec, paths, action in pending:
        source = layout.run_dir(study_dir, spec.variant, spec.seed)
        summary = read_summary(source)
        if summary is not None and summary.status is RunStatus.DIVERGED:
            diverged.append(spec.key)
        elif summary is None or summary.status is not RunStatus.COMPLETED:
            waiting.append(spec.key)
        else:
            config = stage_config(stage, spec.config, source, spec.seed)
            jobs.append(RunJob(spec=RunSpec(spec.variant, spec.seed, dict(spec.labels), config), action=action,
                               stage=stage.name, **paths))
    return jobs, done, waiting, diverged


class Progress:
    """Keeps results.csv current and prints one line per finished run (thread-safe)."""

    def __init__(self, record: StudyRecord, total: int, echo: Callable[[str], None]) -> None:
        self.record, self.total, self.echo = record, total, echo
        self.lock = threading.Lock()
        self.in_flight: set[str] = set()
        self.finished = 0
        self.failed: list[str] = []

    def started(self, job: RunJob) -> None:
        with self.lock:
            self.in_flight.add(job.key)
            update_results(self.record, self.in_flight)
            verb = {"start": "started", "resume": "resuming", "restart": "restarting"}[job.action]
            self.echo(f"  {verb} {job.title}")

    def done(self, job: RunJob, returncode: int | None, seconds: float) -> None:
        with self.lock:
            self.in_flight.discard(job.key)
            self.finished += 1
            summary = read_summary(job.run_dir)
            status = summary.status if summary is not None else RunStatus.FAILED
            if status is RunStatus.RUNNING or (status is RunStatus.COMPLETED and returncode != 0):
                status = RunStatus.FAILED  # the process died without saying why
            loss = summary.final_eval_loss if summary is not None else None
            detail = f", eval loss {loss:.4f}" if loss is not None and status is RunStatus.COMPLETED else ""
            if status not in FINAL:
                self.failed.append(job.title)
                detail = f" (exit {returncode}; log {job.log_path})"
            update_results(self.record, self.in_flight)
            self.echo(f"[{self.finished}/{self.total}] {job.title}: {status}{detail} in {seconds:.0f} s")


def open_log(job: RunJob) -> Any:
    log = open(job.log_path, "ab")  # noqa: SIM115 - closed by the caller
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"\n==== {stamp} {job.action} {job.key}: python {' '.join(job.argv())}\n".encode())
    log.flush()
    return log
