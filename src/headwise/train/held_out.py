"""Evaluation over held-out batches: the sums the trainer takes at every evaluation
(:func:`eval_totals`, :func:`finish_totals`), and a finished run's scores on held-out data other
than its own (:func:`held_out_scores`): its final model on its task with some ``[task]`` keys
replaced, e.g. ``task.validation``. Tuning scores each tuning run on the split the report compares
on with it, to show how well tuning predicts the evaluation."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from headwise.config import atomic_write_text, set_dotted
from headwise.tasks.base import Batch, Task
from headwise.train.config import RunConfig

#: a finished run's scores on other held-out data, by the overrides that made that data
HELD_OUT_FILE = "held_out.json"


@torch.no_grad()
def eval_totals(model: Callable[..., Tensor], task: Task, batches: Sequence[Batch], device: torch.device,
                autocast: contextlib.AbstractContextManager | None = None) -> Tensor:
    """Loss, examples, then each of the task's metrics, summed over ``batches`` with each batch
    weighted by its size (float64 on ``device``): sums, so processes can all-reduce them before
    :func:`finish_totals`."""
    names = task.metric_names
    total = torch.zeros(2 + len(names), dtype=torch.float64, device=device)
    for batch in batches:
        b = batch.to(device)
        with autocast or contextlib.nullcontext():
            loss, metrics = task.evaluate(model, b)
        n = b.inputs.shape[0]
        total[0] += loss.double() * n
        total[1] += n
        for i, name in enumerate(names):
            total[2 + i] += metrics[name].double() * n
    return total


def finish_totals(task: Task, total: Tensor) -> tuple[float, dict[str, float]]:
    """The mean loss and the task's metrics (:meth:`~headwise.tasks.base.Task.finish_metrics`)
    from :func:`eval_totals`' sums."""
    values = (total / total[1]).tolist()
    return values[0], task.finish_metrics(dict(zip(task.metric_names, values[2:])))


def held_out_scores(run_dir: str | Path, overrides: dict[str, Any], device: str = "cpu") -> dict[str, float]:
    """A finished run's final model scored on its task's evaluation batches with the run config's
    dotted ``overrides`` set (e.g. ``{"task.validation": "fraction:0.1:1/2"}``), the text encoded
    with the run's own tokenizer: ``{"loss": ..., metric: ...}``. Kept in the run folder's
    ``held_out.json`` by overrides, so asking again reads them back."""
    from headwise.train.generate import load_run_model, run_config, run_task

    run_dir = Path(run_dir)
    key = json.dumps(overrides, sort_keys=True)
    path = run_dir / HELD_OUT_FILE
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if key in known:
        return known[key]
    cfg = run_config(run_dir).to_dict()
    for dotted, value in overrides.items():
        set_dotted(cfg, dotted, value)
    task = run_task(run_dir, RunConfig.parse(cfg, source=f"{run_dir} with {key}"))
    model, _ = load_run_model(run_dir)
    model.eval()
    loss, metrics = finish_totals(task, eval_totals(model.to(device), task, task.eval_batches(), torch.device(device)))
    known[key] = {"loss": loss, **metrics}
    atomic_write_text(path, json.dumps(known, indent=1))
    return known[key]
