"""Tuning a study's nuisance settings per variant (see :mod:`headwise.study.nuisance`), on the
runner's own backend, in rounds: the grid on every tuning seed, then any extension past an edge,
until every variant has its choice. The chosen values are then set in each variant's run config."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from headwise.config import set_dotted
from headwise.errors import RunFailure
from headwise.study.jobs import RunJob, plan_action
from headwise.study.layout import StudyRecord, job_paths
from headwise.study.nuisance import (
    TUNING_DIR, Choice, Nuisance, Point, choose, grid, label, mean_selection_value, report_split, selection_value,
    tuning_config, write_choices,
)
from headwise.study.definition import RunSpec, Study, Variant

#: rounds of extension after the grid, at most (each axis grows at most ``extend`` times)
MAX_ROUNDS = 16


def tuning_specs(study: Study) -> list[RunSpec]:
    """The tuning runs of the initial grid (for the data and device checks before anything runs)."""
    nuisance = study.config.nuisance
    if nuisance is None:
        return []
    return [RunSpec(v.name, seed, dict(v.labels), tuning_config(v.config, nuisance, p, seed))
            for v in study.variants for p in grid(nuisance.values) for seed in nuisance.seeds]


def tuning_paths(study_dir: Path, variant: str, point: Point, seed: int) -> dict[str, Path]:
    """Where a tuning run keeps its directory, input config, log and lock (under ``tuning/``)."""
    root, name = Path(study_dir) / TUNING_DIR, f"{label(point)}-seed{seed}"
    return job_paths(root, root / variant / name, f"{variant}-{name}")


def _finished(study_dir: Path, variant: str, points: list[Point],
              nuisance: Nuisance) -> tuple[set[Point], dict[Point, float]]:
    """Of ``points``, those whose tuning runs have finished on every tuning seed, and the mean
    selection values of those that completed on every seed."""
    dirs = {p: [tuning_paths(study_dir, variant, p, s)["run_dir"] for s in nuisance.seeds] for p in points}
    done = {p for p in points if all(plan_action(d) is None for d in dirs[p])}
    means = {p: mean_selection_value([selection_value(d, nuisance) for d in dirs[p]]) for p in done}
    return done, {p: x for p, x in means.items() if x is not None}


def _jobs(study_dir: Path, v: Variant, nuisance: Nuisance, point: Point) -> list[RunJob]:
    """The point's tuning runs that have not finished, one per tuning seed."""
    jobs = []
    for seed in nuisance.seeds:
        paths = tuning_paths(study_dir, v.name, point, seed)
        action = plan_action(paths["run_dir"])
        if action is not None:
            spec = RunSpec(f"{v.name}@{label(point)}", seed, dict(v.labels),
                           tuning_config(v.config, nuisance, point, seed))
            jobs.append(RunJob(spec=spec, action=action, **paths))
    return jobs


def _score_on_report_split(study: Study, study_dir: Path, axes: dict[str, dict[str, list[float]]],
                           choices: list[Choice]) -> None:
    """Each choice's ``evaluated``: every tried point's metric on the split the report compares on
    (mean over the tuning seeds; None where one diverged), read back once measured."""
    from headwise.train.held_out import held_out_scores  # torch: a dry run never gets here

    nuisance = study.config.nuisance
    assert nuisance is not None
    for v, c in zip(study.variants, choices):
        split = report_split(nuisance, v.config)
        for point in grid(axes[v.name]):
            if label(point) not in c.tried:
                continue
            values = []
            for seed in nuisance.seeds:
                run_dir = tuning_paths(study_dir, v.name, point, seed)["run_dir"]
                completed = selection_value(run_dir, nuisance) is not None
                values.append(held_out_scores(run_dir, split).get(nuisance.metric) if completed else None)
            c.evaluated[label(point)] = mean_selection_value(values)


def tune(study: Study, study_dir: Path, record: StudyRecord, runner: Any, echo: Callable[[str], None]) -> list[Choice]:
    """Run the tuning rounds (resuming finished ones from disk), set each variant's chosen
    values in its config, and write ``tuning/tuning.json``. A RunFailure when a tuning run
    failed (rerunning retries it) or when none of a variant's tuning runs completed."""
    nuisance = study.config.nuisance
    assert nuisance is not None
    axes = {v.name: copy.deepcopy(nuisance.values) for v in study.variants}
    extensions: dict[str, dict[str, int]] = {v.name: {} for v in study.variants}
    for _ in range(MAX_ROUNDS):
        choices, todo = [], []
        for v in study.variants:
            done, values = _finished(study_dir, v.name, grid(axes[v.name]), nuisance)
            choice, pending = choose(v.name, axes[v.name], done, values, nuisance, extensions[v.name])
            # an extension adds points whose directories may already hold finished runs
            while pending:
                more, more_values = _finished(study_dir, v.name, pending, nuisance)
                if len(more) < len(pending):
                    break
                done, values = done | more, values | more_values
                choice, pending = choose(v.name, axes[v.name], done, values, nuisance, extensions[v.name])
            choices.append(choice)
            todo += [job for p in pending for job in _jobs(study_dir, v, nuisance, p)]
        if not todo:
            break
        echo(f"tuning {', '.join(nuisance.values)}: {len(todo)} runs on seeds "
             f"{', '.join(map(str, nuisance.seeds))}")
        failed = runner.run(todo, record, echo)
        if failed:
            raise RunFailure(f"{len(failed)} tuning runs did not complete: {', '.join(failed[:5])}; "
                             f"see {study_dir / 'tuning' / 'logs'}; rerun the same command to finish them")
    if not any(c.best is None for c in choices):
        _score_on_report_split(study, study_dir, axes, choices)
    write_choices(study_dir, choices)
    lost = [c.variant for c in choices if c.best is None]
    if lost:
        raise RunFailure(f"no tuning run of {', '.join(lost)} completed (all diverged?): widen the [nuisance] grid")
    for v, c in zip(study.variants, choices):
        for key, value in (c.best or {}).items():
            set_dotted(v.config, key, value)
        edge = f" (at the edge of the grid: {', '.join(c.at_edge)})" if c.at_edge else ""
        echo(f"  {v.name}: " + ", ".join(f"{k} = {x:g}" for k, x in (c.best or {}).items()) + edge)
    return choices
