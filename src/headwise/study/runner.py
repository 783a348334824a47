"""Run every run of a study, resumably: locally as subprocesses or as Ray tasks.

Each run is ``python -m headwise train CONFIG --out RUN_DIR`` (through
:mod:`headwise.study.worker`, which holds the run's lock and dies with the runner). Before
starting, the state of every run directory decides what happens to it:

- ``completed`` (and ``diverged``, a result of the experiment rather than a crash): skipped;
- a run with checkpoints that did not complete (killed, interrupted, failed): ``--resume``;
- a run directory without a checkpoint: started again with ``--overwrite``;
- no run directory: started.

What all runs share (output directory, device, data) is checked first, by
:mod:`headwise.study.preflight`: a study that cannot run is refused before anything is written.
One failing run never stops the others; ``results.csv`` is rewritten as each run ends.

The experiment trackers the base config names (``[base.log] trackers``) group the runs: each
run's ``[log]`` gets the study's group (the W&B group, the MLflow parent run; see
:func:`headwise.train.trackers.open_group`), and the report's figures go to the study's record.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from importlib.metadata import version as installed_version

from headwise.errors import HeadwiseError, RunFailure, sigterm_interrupts
from headwise.locks import FileLock
from headwise.run import RunStatus
from headwise.study import layout
from headwise.study.jobs import Progress, RunJob, plan_jobs, plan_stage_jobs
from headwise.study.launch import LocalLauncher, RayLauncher
from headwise.study.layout import StudyRecord, load_study_record, save_study
from headwise.study.preflight import check_out_dir
from headwise.study.results import RunResult, update_results
from headwise.study.definition import RunSpec, Study, study_identity
from headwise.study.stages import preflight_config, stage_record
from headwise.study.tuning import tune, tuning_specs
from headwise.train import trackers
from headwise.train.config import LogConfig

BACKENDS = ("local", "ray")


@dataclass
class StudyOutcome:
    """What a study run ended with."""

    study_dir: Path
    results: list[RunResult]
    ran: list[str]
    skipped: list[str]
    failed: list[str]
    report: Path | None = None


def prepare_study_dir(study: Study, study_dir: Path, seeds_given: bool) -> int:
    """Check that ``study_dir`` is empty, new, or holds this same study; returns the number of
    seeds to record (a rerun without --seeds keeps the recorded number). Writes nothing."""
    if not study_dir.exists():
        return study.seeds
    if not study_dir.is_dir():
        raise HeadwiseError(f"--out {study_dir} is a file, not a directory")
    saved = study_dir / layout.STUDY_TOML
    if not saved.is_file():
        if any(p.name != ".lock" for p in study_dir.iterdir()):
            raise HeadwiseError(f"--out {study_dir} is not empty and holds no study; choose another directory")
        return study.seeds
    record = load_study_record(study_dir)
    # Compared by definition rather than by the saved fingerprint, so that a study saved by an
    # older headwise (whose fingerprint also covered the report table) still matches.
    saved_identity = study_identity(record.name, record.preset, record.definition)
    if json.dumps(saved_identity, sort_keys=True) != json.dumps(study.identity(), sort_keys=True):
        what = f"study {record.name!r}" + (f" (preset {record.preset!r})" if record.preset else "")
        raise HeadwiseError(
            f"--out {study_dir} holds a different study ({what}, defined differently); "
            "choose another --out, or rerun that study's own command"
        )
    if not seeds_given:
        study.seeds = record.seeds
    return max(record.seeds, study.seeds)


def check_options(backend: str, address: str | None, jobs: int | None, threads: int | None) -> None:
    """Refuse an unknown backend, ``--address`` without Ray, and ``--jobs`` or ``--threads`` below 1."""
    if backend not in BACKENDS:
        raise HeadwiseError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise HeadwiseError(f"--jobs {jobs}: give at least 1")
    if threads is not None and threads < 1:
        raise HeadwiseError(f"--threads {threads}: give at least 1")
    if address and backend != "ray":
        raise HeadwiseError("--address joins a Ray cluster: use it with --backend ray")


def default_threads(jobs: int, backend: str) -> int:
    """Torch threads per run when neither the command nor the definition says: on Ray 1 (a task
    holds one CPU per thread); here ``OMP_NUM_THREADS`` when the user set it, else the cores
    shared among the runs that run at once."""
    if backend != "local":
        return 1
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return max(1, (os.cpu_count() or 1) // jobs)


def check_environment(study_dir: Path, recorded: dict[str, Any], threads: int | None, fallback: int) -> dict[str, Any]:
    """What the runs' numbers depend on beyond their configs, to record: torch threads per run
    (``threads``, else the recorded, else ``fallback``) and torch's version. A study's or a
    search's folder keeps the ones it first ran with: a rerun that would mix in others
    (``recorded``) is refused in one line."""
    torch_version = installed_version("torch")
    if recorded.get("threads") and threads and threads != recorded["threads"]:
        raise HeadwiseError(f"--out {study_dir} ran its runs with {recorded['threads']} torch thread(s) each, and a "
                            f"run's numbers depend on it: rerun with --threads {recorded['threads']}, or choose another --out")
    if recorded.get("torch") and recorded["torch"] != torch_version:
        raise HeadwiseError(f"--out {study_dir} ran under torch {recorded['torch']}, this is torch {torch_version}: "
                            "its runs' numbers would mix two versions; use that torch, or choose another --out")
    return {"threads": threads or recorded.get("threads") or fallback, "torch": torch_version}


def stage_specs(study: Study) -> list[RunSpec]:
    """One run per stage and variant it starts from, for the checks before anything runs (see
    :func:`~headwise.study.stages.preflight_config`)."""
    return [RunSpec(v.name, 0, dict(v.labels), preflight_config(stage, v.config))
            for stage in study.config.stages for v in study.variants if stage.runs_from(v.name)]


def run_stages(study: Study, record: StudyRecord, runner: Any, log: LogConfig,
               echo: Callable[[str], None]) -> list[str]:
    """Run every stage's unfinished runs whose sources have completed, stage by stage; returns the
    titles of the stage runs that failed (a run waiting for its source is counted with the source)."""
    failed: list[str] = []
    for stage in study.config.stages:
        jobs, done, waits, diverged = plan_stage_jobs(study, record.path, stage)
        sub = stage_record(record, stage.name)
        echo(f"stage {stage.name}: {len(done)} runs finished, {len(jobs)} to run"
             + (f", {len(waits)} waiting for a source run that did not complete" if waits else "")
             + (f", {len(diverged)} not run (their source diverged)" if diverged else ""))
        join_group(jobs, log, record.path)
        update_results(sub)
        failed += runner.run(jobs, sub, echo)
        update_results(sub)
    return failed


def join_group(jobs: list[RunJob], log: LogConfig, study_dir: Path) -> str:
    """Set up the study's record in its trackers and put the keys that join it (and the run's
    name, ``variant/seedN``) in each job's ``[log]``; returns the group's name (``log.group``,
    else the study directory's name)."""
    group = log.group or study_dir.name
    keys = trackers.open_group(log, study_dir, group) if jobs else {}
    for job in jobs:
        if keys:
            job.spec.config.setdefault("log", {}).update(keys, name=job.title)
    return group


def run_study(
    study: Study,
    out_dir: str | Path | None = None,
    *,
    jobs: int | None = None,
    threads: int | None = None,
    backend: str = "local",
    address: str | None = None,
    seeds_given: bool = True,
    report: Callable[[Path], Path] | None = None,
    echo: Callable[[str], None] = print,
) -> StudyOutcome:
    """Run (or resume) every run of ``study`` into ``out_dir``, then call ``report`` (e.g.
    :func:`headwise.report.write_report`) on the study directory, whatever the runs' outcome.

    Raises HeadwiseError (nothing written, no study directory made) when ``out_dir`` holds
    something else or when what the runs share is not there (see :mod:`headwise.study.preflight`),
    and RunFailure after the report when some runs failed (rerunning retries them).
    """
    check_options(backend, address, jobs, threads)
    jobs = jobs or study.config.runner.jobs
    study_dir = Path(out_dir) if out_dir is not None else study.default_out("studies_out")
    recorded_seeds = prepare_study_dir(study, study_dir, seeds_given)
    recorded = load_study_record(study_dir).environment if (study_dir / layout.STUDY_TOML).is_file() else {}
    environment = check_environment(study_dir, recorded, threads or study.config.runner.threads,
                                    default_threads(jobs or 1, backend))
    threads = environment["threads"]
    check_out_dir(study_dir)
    study_dir = study_dir.resolve()
    log = LogConfig.parse(study.config.base.get("log", {}), source=f"study {study.name} [base.log]")
    trackers.check_trackers(log)
    todo, done = plan_jobs(study, study_dir)  # reads the run directories only
    where = f"{backend}" + (f" at {address}" if address else "")
    echo(f"study {study.name}" + (f" (preset {study.preset})" if study.preset else "")
         + f": {len(study.runs())} runs, {len(done)} already finished, {len(todo)} to run ({where}) -> {study_dir}")
    launcher = LocalLauncher() if backend == "local" else RayLauncher(address, "study")
    runner = _Backend(launcher, (jobs or 1) if backend == "local" else jobs, threads)
    dir_lock = FileLock(study_dir / ".lock")  # one runner per study directory at a time
    try:
        # Nothing is written into the study directory before every run's shared needs are met.
        specs = [j.spec for j in todo] + tuning_specs(study) + stage_specs(study)
        if specs:  # the launcher's checks (device, data; on Ray the shared folder)
            launcher.preflight(specs, study_dir, threads, echo)
        study_dir.mkdir(parents=True, exist_ok=True)
        if not dir_lock.acquire():
            raise HeadwiseError(f"another `headwise study` is running in {study_dir}; wait for it or stop it")
        save_study(study, study_dir, recorded_seeds, environment)
        record = load_study_record(study_dir)
        if study.config.nuisance is not None:
            tune(study, study_dir, record, runner, echo)  # sets each variant's best values
        todo, done = plan_jobs(study, study_dir)
        group = join_group(todo, log, study_dir)
        update_results(record)
        failed = runner.run(todo, record, echo)
        results = update_results(record)
        failed += run_stages(study, record, runner, log, echo)
    finally:
        dir_lock.release()
        launcher.close()
    outcome = StudyOutcome(study_dir, results, [j.key for j in todo], done, failed)
    figures: list[Path] = []
    if report is not None:
        outcome.report = report(study_dir)
        echo(f"report: {outcome.report}")
        figures = sorted(outcome.report.parent.rglob("*.png"))
    for line in trackers.close_group(log, study_dir, not failed, group, figures):
        echo(f"warning: {line}")
    if failed:
        stopped = [f"{r.variant}/seed{r.seed}" for r in results if r.status is RunStatus.INTERRUPTED]
        total = sum(1 + sum(s.runs_from(r.variant) for s in study.config.stages) for r in study.runs())
        what = f"{len(failed)} of {total} runs did not complete"
        if stopped:
            what += f" ({len(stopped)} interrupted: they resume from their checkpoints)"
        raise RunFailure(
            f"{what}: {', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''}; see {study_dir / 'logs'}"
            + (f" (a stage's runs: {study_dir / 'stages' / 'NAME' / 'logs'})" if study.config.stages else "")
            + "; rerun the same command to finish them"
        )
    return outcome


class _Backend:
    """Up to ``jobs`` runs at a time (None: as many as the cluster takes), each started by
    ``launcher`` (:mod:`headwise.study.launch`) on ``threads`` torch threads."""

    def __init__(self, launcher: LocalLauncher | RayLauncher, jobs: int | None, threads: int) -> None:
        self.launcher, self.jobs, self.threads = launcher, jobs, threads

    def run(self, jobs: list[RunJob], record: StudyRecord, echo: Callable[[str], None]) -> list[str]:
        """Write ``jobs``' inputs and run them to their ends, keeping ``record``'s results.csv
        current (:class:`~headwise.study.jobs.Progress`); the titles of those that failed. On
        Ctrl-C or SIGTERM stop the running ones, then re-raise."""
        progress = Progress(record, len(jobs), echo)
        for job in jobs:
            job.write_inputs()
        queue, running = list(jobs), {}
        with sigterm_interrupts():
            try:
                while queue or running:
                    while queue and (self.jobs is None or len(running) < self.jobs):
                        job = queue.pop(0)
                        progress.started(job)
                        running[self.launcher.launch(job, self.threads)] = (job, time.monotonic())
                    for run in [r for r in running if r.poll()]:
                        job, t0 = running.pop(run)
                        progress.done(job, run.wait(), time.monotonic() - t0)
                    time.sleep(self.launcher.poll_s)
            except KeyboardInterrupt:
                # Ctrl-C reached local runs too (same process group); SIGTERM only reached us
                self.launcher.stop_all(list(running))
                raise
        return progress.failed
