"""Attention analysis of saved runs and studies: condition number vs step, and vs total heads.

A run directory (:class:`headwise.run.RunDir`) holds the resolved run config, its summary,
``checkpoints/step_XXXXXXXX/`` and the final ``model/``. The evaluation inputs are the first
batches of the run's own task (``headwise.tasks.union.build_task`` on the config's ``[task]``),
so every checkpoint of a run is measured on the same sequences.

:func:`final_conditioning` measures a run's final model; ``headwise analyze STUDY_DIR``
(:func:`condition_vs_heads`) and the study report both go through it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torch import Tensor

from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.model import WEIGHTS_FILE, load_pretrained
from headwise.run import RunDir, RunStatus, read_summary
from headwise.run.layout import CONFIG_FILE, SUMMARY_FILE

CHECKPOINT_RE = re.compile(r"^step_(\d+)$")
RUN_COLUMNS = ["step", "layer", "heads", "head_dim", "width", "attention", "cond_mean", "cond_median",
               "rank_deficient", "entropy", "entropy_uniform", "erank"]
STUDY_COLUMNS = ["run", "scheme", "seed", "n_layers", "heads", "total_heads", "step", "cond_mean",
                 "cond_median", "rank_deficient", "entropy", "erank", "status"]


def find_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every saved checkpoint of a run, by step; none is a HeadwiseError."""
    root = RunDir(run_dir).checkpoints
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = CHECKPOINT_RE.match(p.name)
            if m and p.is_dir():  # one without weights is reported when it is loaded
                found.append((int(m.group(1)), p))
    if not found:
        raise HeadwiseError(f"{run_dir} has no checkpoints (expected {root}/step_XXXXXXXX/{WEIGHTS_FILE})")
    return sorted(found)


def eval_inputs(run_dir: str | Path, batches: int) -> list[Tensor]:
    """The inputs of the first ``batches`` evaluation batches of the run's task, its text encoded
    with the tokenizer the run saved (:func:`headwise.train.generate.run_task`), never a BPE
    trained again on text that may have changed since."""
    from headwise.train.generate import run_config, run_task

    run_dir = Path(run_dir)
    return [b.inputs for b in run_task(run_dir, run_config(run_dir)).eval_batches()[:batches]]


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise HeadwiseError(f"{run_dir} is not a directory")
    if not RunDir(run_dir).has_run():
        raise HeadwiseError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")


def analyze_run(
    run_dir: str | Path,
    checkpoints: str = "all",
    batches: int = 2,
    device: str = "cpu",
    inputs: list[Tensor] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Analyse a run's checkpoints (``"all"`` or ``"last"``) on its first ``batches`` evaluation
    batches (or on ``inputs``); one row per checkpoint and layer (columns :data:`RUN_COLUMNS`),
    plus a ``layer = "all"`` row per checkpoint with the averages over layers.

    A checkpoint that cannot be loaded (a damaged file) is skipped with a one-line warning
    through ``progress`` (stderr without it); ``"last"`` is then the newest that loads. None
    loading is a HeadwiseError."""
    run_dir = Path(run_dir)
    _check_run_dir(run_dir)
    if checkpoints not in ("all", "last"):
        raise HeadwiseError(f"checkpoints must be 'all' or 'last', not {checkpoints!r}")
    found = find_checkpoints(run_dir)
    if inputs is None:
        inputs = eval_inputs(run_dir, batches)
    rows, skipped = [], []
    for step, path in reversed(found) if checkpoints == "last" else found:
        try:
            model = load_pretrained(path, map_location=device)
        except HeadwiseError as exc:  # a damaged file, or weights that do not fit spec.json
            skipped.append(f"skipped checkpoint {path.name}: {exc}")
            (progress or _stderr)(f"warning: {skipped[-1]}")
            continue
        result = model.spec.analyze(model, inputs)
        for row in result.rows():
            rows.append({"step": step, **row})
        if progress:
            progress(f"step {step}: condition number {result.cond_mean:.4g} (mean over layers)")
        if checkpoints == "last":
            break
    if not rows:
        raise HeadwiseError(f"no checkpoint of {run_dir} can be loaded ({skipped[-1]}): resume or train the run again")
    return rows


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def find_runs(study_dir: str | Path) -> list[Path]:
    """Run directories (holding a config and a summary) under a study directory."""
    study_dir = Path(study_dir)
    runs = sorted(p.parent for p in study_dir.rglob(SUMMARY_FILE) if RunDir(p.parent).has_run())
    # A run's own subfolders (checkpoints, analysis) never hold another run.
    return [r for r in runs if not any(o != r and o in r.parents for o in runs)]


@dataclass(frozen=True)
class FinalConditioning:
    """The attention conditioning of a run's final model (averages over layers)."""

    #: the checkpoint measured; None for the final ``model/`` directory
    step: int | None
    cond_mean: float
    cond_median: float
    rank_deficient: float
    entropy: float
    erank: float


def final_model_dir(run_dir: str | Path) -> tuple[int | None, Path]:
    """The run's final weights: ``model/``, else its last checkpoint (and that checkpoint's step)."""
    final = RunDir(run_dir).model
    if (final / WEIGHTS_FILE).is_file():
        return None, final
    return find_checkpoints(run_dir)[-1]


def final_conditioning(run_dir: str | Path, inputs: list[Tensor], device: str = "cpu") -> FinalConditioning:
    """Measure the final model of a run (:func:`final_model_dir`) on ``inputs``."""
    step, model_dir = final_model_dir(run_dir)
    model = load_pretrained(model_dir, map_location=device)
    result = model.spec.analyze(model, inputs)
    overall = result.rows()[-1]
    return FinalConditioning(step, result.cond_mean, result.cond_median, overall["rank_deficient"],
                             overall["entropy"], overall["erank"])


def condition_vs_heads(
    study_dir: str | Path,
    batches: int = 2,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per completed run of a study (columns :data:`STUDY_COLUMNS`): its plan's scheme
    and heads, its seed, and the final model's conditioning on its task's first ``batches`` eval
    batches. Runs that are not completed are skipped (reported through ``progress``)."""
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise HeadwiseError(f"{study_dir} is not a directory")
    runs = find_runs(study_dir)
    if not runs:
        raise HeadwiseError(f"{study_dir} holds no run directories (with {CONFIG_FILE} and {SUMMARY_FILE})")
    cached_inputs: dict[str, list[Tensor]] = {}
    rows = []
    for run in runs:
        name = str(run.relative_to(study_dir))
        summary = read_summary(run)
        if summary is None or summary.status is not RunStatus.COMPLETED:
            if progress:
                progress(f"{name}: skipped ({'no readable summary' if summary is None else f'status {summary.status}'})")
            continue
        config = read_toml(RunDir(run).config)
        # Runs of one study usually share a task: build its eval batches once (per tokenizer:
        # runs of one task table may have learnt their BPE from other versions of its text).
        key = json.dumps([config.get("task", {}), summary.tokenizer], sort_keys=True)
        if key not in cached_inputs:
            cached_inputs[key] = eval_inputs(run, batches)
        try:
            c = final_conditioning(run, cached_inputs[key], device)
        except HeadwiseError as exc:  # its final weights are damaged
            if progress:
                progress(f"{name}: skipped ({exc})")
            continue
        plan = summary.plan
        rows.append(dict(
            run=name, scheme=plan.scheme.value, seed=config.get("train", {}).get("seed", 0),
            n_layers=plan.n_layers, heads="-".join(map(str, plan.heads)), total_heads=plan.total,
            step=c.step if c.step is not None else summary.steps,
            cond_mean=c.cond_mean, cond_median=c.cond_median, rank_deficient=c.rank_deficient,
            entropy=c.entropy, erank=c.erank, status=summary.status.value,
        ))
        if progress:
            progress(f"{name}: {plan.total} heads, condition number {c.cond_mean:.4g}")
    if not rows:
        raise HeadwiseError(f"{study_dir} has no completed runs to analyse")
    return rows


def rows_to_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """CSV text of ``rows`` (floats with full precision; ``inf`` for rank-deficient)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()})
    return buf.getvalue()


def write_csv(rows: list[dict[str, Any]], columns: list[str], path: str | Path) -> Path:
    """Write :func:`rows_to_csv` atomically."""
    atomic_write_text(Path(path), rows_to_csv(rows, columns))
    return Path(path)
