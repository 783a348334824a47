"""What every run of a study shares, checked before the first run starts and before anything is
written into the study directory: the output directory, the device and the data.

A study whose data cannot be had (``HEADWISE_DATA`` unset, a missing file, the hub offline), whose
runs ask for ``train.device = "cuda"`` where there is none, or whose ``--out`` cannot be made is
refused with one line (a :class:`~headwise.errors.HeadwiseError`, exit 2) and leaves no study
directory behind. Each run's own spec is checked when the study is loaded
(:func:`headwise.study.definition.resolve_run_model`).

Preparing the data (tokenizing it into the token cache, which lives outside the study directory)
is the check: once it succeeds the runs only open the cache. Locally it runs in this process;
with Ray it runs as one Ray task per distinct ``[task]`` table on the cluster, where the runs
will read the data (the study's driver may not see the same files).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

from headwise.errors import HeadwiseError
from headwise.study.definition import RunSpec


def check_out_dir(study_dir: Path) -> None:
    """``study_dir`` must be (or be creatable as) a writable folder: its nearest existing parent
    is a writable folder. Writes nothing."""
    parent = study_dir
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if parent != study_dir and not parent.is_dir():
        raise HeadwiseError(f"--out {study_dir}: {parent} is a file, so the study directory cannot be made there")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise HeadwiseError(f"--out {study_dir}: {parent} is not writable; choose another directory")


def distinct_tasks(specs: Iterable[RunSpec]) -> list[tuple[dict[str, Any], int]]:
    """Each distinct ``[task]`` table of the runs (in run order) with how many runs use it."""
    seen: dict[str, list[Any]] = {}
    for spec in specs:
        task = spec.config.get("task", {})
        entry = seen.setdefault(repr(sorted(task.items())), [task, 0])
        entry[1] += 1
    return [(task, n) for task, n in seen.values()]


def check_devices(specs: Iterable[RunSpec], gpus: float, where: str) -> None:
    """Refuse runs that ask for ``train.device = "cuda"`` when ``where`` has no GPU."""
    cuda = [s.key for s in specs if str(s.config.get("train", {}).get("device", "auto")) == "cuda"]
    if cuda and gpus <= 0:
        more = f" and {len(cuda) - 1} more" if len(cuda) > 1 else ""
        raise HeadwiseError(
            f"run {cuda[0]}{more} set train.device = 'cuda' but {where} has no CUDA device; "
            "set train.device to 'auto' or 'cpu' (e.g. --set train.device=cpu)"
        )


def prepare_task_data(task: dict[str, Any], progress: bool = False) -> str | None:
    """Prepare one ``[task]`` table's data; returns why it cannot be had (one line), else None.

    The body of the Ray preflight task, and of the local one (which shows progress: a bar when
    stderr is a terminal)."""
    from headwise.tasks.union import parse_task_config

    try:
        parse_task_config(task).prepare(progress=progress)
    except HeadwiseError as exc:
        return str(exc)
    return None


def check_data(specs: list[RunSpec], echo: Callable[[str], None],
               prepare: Callable[[list[dict[str, Any]]], list[str | None]] | None = None) -> None:
    """Prepare each distinct task's data once (so parallel runs share one cache instead of each
    building it); the first that cannot be had stops the study with its reason.

    ``prepare`` maps the task tables to their outcomes (default: :func:`prepare_task_data` here)."""
    from headwise.tasks.union import parse_task_config

    todo = []
    for task, n in distinct_tasks(specs):
        what = parse_task_config(task).data_description()
        if what is not None:  # None: made on the fly, nothing to prepare
            todo.append((task, n, what))
    for _, _, what in todo:
        echo(f"  preparing data: {what}")
    outcomes = prepare([t for t, _, _ in todo]) if prepare else [prepare_task_data(t, progress=True) for t, _, _ in todo]
    for (_, n, what), problem in zip(todo, outcomes):
        if problem is not None:
            runs = "the study's run" if n == 1 else f"{n} runs"
            raise HeadwiseError(f"data of {runs} ({what}) is not ready, so no run was started: {problem}")


def check_here(specs: list[RunSpec], echo: Callable[[str], None]) -> None:
    """The checks of runs on this machine: refuse CUDA runs where there is no CUDA, and prepare
    the runs' data here."""
    import torch

    check_devices(specs, torch.cuda.device_count() if torch.cuda.is_available() else 0, "this machine")
    check_data(specs, echo)
