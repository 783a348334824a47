"""Attention analysis of saved runs and studies: condition number vs step, and vs total heads.

A run directory holds ``config.toml`` (the resolved run config), ``summary.json``,
``checkpoints/step_XXXXXXXX/`` and ``model/`` (see the run contract). The evaluation inputs are
the first batches of the run's own task (``headwise.tasks.config.build_task`` on the config's
``[task]``), so every checkpoint of a run is measured on the same sequences.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from torch import Tensor

from headwise.analysis.conditioning import analyze_model
from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.model import load_pretrained

CHECKPOINT_RE = re.compile(r"^step_(\d+)$")
RUN_COLUMNS = ["step", "layer", "heads", "head_dim", "width", "attention", "cond_mean", "cond_median",
               "rank_deficient", "entropy", "entropy_uniform", "erank"]
STUDY_COLUMNS = ["run", "scheme", "seed", "n_layers", "heads", "total_heads", "step", "cond_mean",
                 "cond_median", "rank_deficient", "entropy", "erank", "status"]


def find_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every saved checkpoint of a run, by step; none is a HeadwiseError."""
    root = Path(run_dir) / "checkpoints"
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = CHECKPOINT_RE.match(p.name)
            if m and p.is_dir() and (p / "model.safetensors").is_file():
                found.append((int(m.group(1)), p))
    if not found:
        raise HeadwiseError(f"{run_dir} has no checkpoints (expected {root}/step_XXXXXXXX/model.safetensors)")
    return sorted(found)


def eval_inputs(run_dir: str | Path, batches: int) -> list[Tensor]:
    """The inputs of the first ``batches`` evaluation batches of the run's task."""
    from headwise.tasks.config import build_task
    from headwise.train.config import RunConfig

    cfg = RunConfig.load(Path(run_dir) / "config.toml")
    return [b.inputs for b in build_task(cfg.task).eval_batches()[:batches]]


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise HeadwiseError(f"{run_dir} is not a directory")
    if not (run_dir / "config.toml").is_file():
        raise HeadwiseError(f"{run_dir} is not a run directory: it has no config.toml")


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
    plus a ``layer = "all"`` row per checkpoint with the averages over layers."""
    run_dir = Path(run_dir)
    _check_run_dir(run_dir)
    if checkpoints not in ("all", "last"):
        raise HeadwiseError(f"checkpoints must be 'all' or 'last', not {checkpoints!r}")
    found = find_checkpoints(run_dir)
    if checkpoints == "last":
        found = found[-1:]
    if inputs is None:
        inputs = eval_inputs(run_dir, batches)
    rows = []
    for step, path in found:
        result = analyze_model(load_pretrained(path, map_location=device), inputs)
        for row in result.rows():
            rows.append({"step": step, **row})
        if progress:
            progress(f"step {step}: condition number {result.cond_mean:.4g} (mean over layers)")
    return rows


def find_runs(study_dir: str | Path) -> list[Path]:
    """Run directories (holding ``config.toml`` and ``summary.json``) under a study directory."""
    study_dir = Path(study_dir)
    runs = sorted(p.parent for p in study_dir.rglob("summary.json") if (p.parent / "config.toml").is_file())
    # A run's own subfolders (checkpoints, analysis) never hold another run.
    return [r for r in runs if not any(o != r and o in r.parents for o in runs)]


def run_scheme(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The head scheme of a run: ``model.plan.scheme`` of its config, else the plan the trainer
    recorded in its summary, else ``"explicit"`` (heads given per layer)."""
    plan = config.get("model", {}).get("plan") or summary.get("plan") or {}
    return plan.get("scheme") or "explicit"


def _final_model_dir(run_dir: Path) -> tuple[int | None, Path]:
    if (run_dir / "model" / "model.safetensors").is_file():
        return None, run_dir / "model"
    step, path = find_checkpoints(run_dir)[-1]
    return step, path


def condition_vs_heads(
    study_dir: str | Path,
    batches: int = 2,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per completed run of a study (columns :data:`STUDY_COLUMNS`): its scheme, seed,
    heads and the final model's conditioning on its task's first ``batches`` eval batches.
    Runs that are not completed are skipped (reported through ``progress``)."""
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise HeadwiseError(f"{study_dir} is not a directory")
    runs = find_runs(study_dir)
    if not runs:
        raise HeadwiseError(f"{study_dir} holds no run directories (with config.toml and summary.json)")
    cached_inputs: dict[str, list[Tensor]] = {}
    rows = []
    for run in runs:
        config = read_toml(run / "config.toml")
        summary = json.loads((run / "summary.json").read_text())
        name = str(run.relative_to(study_dir))
        status = summary.get("status", "unknown")
        if status != "completed":
            if progress:
                progress(f"{name}: skipped (status {status})")
            continue
        # Runs of one study usually share a task: build its eval batches once.
        key = json.dumps(config.get("task", {}), sort_keys=True)
        if key not in cached_inputs:
            cached_inputs[key] = eval_inputs(run, batches)
        step, model_dir = _final_model_dir(run)
        model = load_pretrained(model_dir, map_location=device)
        result = analyze_model(model, cached_inputs[key])
        metrics = result.rows()[-1]
        rows.append(dict(
            run=name, scheme=run_scheme(config, summary), seed=config.get("train", {}).get("seed", 0),
            n_layers=model.spec.n_layers, heads="-".join(map(str, model.spec.heads)),
            total_heads=model.spec.total_heads, step=step if step is not None else summary.get("steps"),
            cond_mean=result.cond_mean, cond_median=result.cond_median,
            rank_deficient=metrics["rank_deficient"], entropy=metrics["entropy"], erank=metrics["erank"],
            status=status,
        ))
        if progress:
            progress(f"{name}: {model.spec.total_heads} heads, condition number {result.cond_mean:.4g}")
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
