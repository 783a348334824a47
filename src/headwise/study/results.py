"""The results table of a study: one row per run, read from the run directories.

``results.csv`` is rebuilt from disk (each run's ``summary.json`` and ``config.toml``) every
time a run finishes, so it is never out of step with the runs themselves.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable

from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.study.layout import RESULTS_CSV, StudyRecord, lock_path, log_path, run_dir

#: Columns after the variant, the seed and one column per axis.
COLUMNS = [
    "heads", "total_heads", "n_layers", "d_model", "head_dims", "params", "final_eval_loss",
    "wall_time_s", "train_time_s", "tokens_per_s", "peak_memory_mb", "steps", "tokens", "status",
    "run_dir", "error",
]


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run's ``summary.json``, or None when it has none (or it is unreadable mid-write)."""
    try:
        return json.loads((Path(path) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_run_config(path: Path) -> dict[str, Any] | None:
    """A run's resolved ``config.toml``, or None."""
    p = Path(path) / "config.toml"
    if not p.is_file():
        return None
    try:
        return read_toml(p)
    except HeadwiseError:
        return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (a torn last line from a crash is skipped)."""
    p = Path(path) / "metrics.jsonl"
    rows = []
    if p.is_file():
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def run_status(path: Path, in_flight: bool = False, attempted: bool = False) -> str:
    """pending (never started), running, failed (started but left no summary), or the
    summary's status; a run that says ``running`` but has no live process was killed, and is
    reported as ``interrupted``."""
    path = Path(path)
    if in_flight:
        return "running"
    summary = read_summary(path)
    if summary is None:
        if attempted:
            return "failed"
        return "interrupted" if path.exists() and any(path.iterdir()) else "pending"
    status = summary.get("status") or "interrupted"
    return "interrupted" if status == "running" else str(status)


def lock_held(path: Path) -> bool:
    """True while a run's worker holds its lock file (the run is live, perhaps under another
    runner): then a summary that says ``running`` is believed."""
    try:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def last_error(log: Path) -> str:
    """The last ``headwise: error/failed`` line of a run's log (why it stopped), or ""."""
    try:
        lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith(("headwise: error:", "headwise: failed:")) or "Error:" in line:
            return line.strip()
    return ""


def study_run_status(record: StudyRecord, variant: str, seed: int, in_flight: bool = False) -> str:
    """:func:`run_status` of one run of a study: live while its worker holds the run's lock,
    failed when it was started (it has a log) but left no summary."""
    lock = lock_path(record.path, variant, seed)
    live = in_flight or (lock.is_file() and lock_held(lock))
    return run_status(run_dir(record.path, variant, seed), live, attempted=log_path(record.path, variant, seed).is_file())


def axis_names(record: StudyRecord) -> list[str]:
    """The axis columns of a study, in the order they first appear."""
    names: list[str] = []
    for v in record.variants:
        for k in v.get("labels", {}):
            if k != "variant" and k not in names:
                names.append(k)
    return names


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def run_row(record: StudyRecord, variant: dict[str, Any], seed: int, in_flight: bool = False) -> dict[str, Any]:
    """One results row for a run, from whatever its directory holds so far."""
    rd = run_dir(record.path, variant["name"], seed)
    log = log_path(record.path, variant["name"], seed)
    summary = read_summary(rd) or {}
    status = study_run_status(record, variant["name"], seed, in_flight)
    model = (read_run_config(rd) or {}).get("model", {})
    heads = summary.get("heads") or model.get("heads") or []
    head_dims = summary.get("head_dims") or []
    peak = _finite(summary.get("peak_memory_bytes"))
    row: dict[str, Any] = {"variant": variant["name"], "seed": seed}
    for axis in axis_names(record):
        row[axis] = variant.get("labels", {}).get(axis, "")
    row.update(
        heads=" ".join(map(str, heads)),
        total_heads=summary.get("total_heads") or (sum(heads) if heads else ""),
        n_layers=model.get("n_layers", len(heads) or ""),
        d_model=model.get("d_model", ""),
        head_dims=" ".join(map(str, head_dims)),
        params=summary.get("params", ""),
        final_eval_loss=_finite(summary.get("final_eval_loss")),
        wall_time_s=_finite(summary.get("wall_time_s")),
        train_time_s=_finite(summary.get("train_time_s")),
        tokens_per_s=_finite(summary.get("tokens_per_s")),
        peak_memory_mb=None if peak is None else round(peak / 2**20, 1),
        steps=summary.get("steps", ""),
        tokens=summary.get("tokens", ""),
        status=status,
        run_dir=str(rd.relative_to(record.path)),
        error=str(summary.get("error") or (last_error(log) if status == "failed" else "")).replace("\n", " ")[:300],
    )
    return row


def collect_results(record: StudyRecord, in_flight: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Rows for every run of the study; ``in_flight`` holds ``variant/seedK`` keys now running."""
    live = set(in_flight)
    return [run_row(record, v, s, f"{v['name']}/seed{s}" in live) for v, s in record.runs()]


def write_results(record: StudyRecord, rows: list[dict[str, Any]]) -> Path:
    """Write ``results.csv`` atomically; floats with enough digits to compare runs."""
    path = record.path / RESULTS_CSV
    atomic_write_text(path, rows_to_csv(rows))
    return path


def rows_to_csv(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """Rows as CSV text (None becomes an empty cell)."""
    if columns is None:
        columns = list(rows[0]) if rows else []
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _cell(r.get(k)) for k in columns})
    return buf.getvalue()


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def update_results(record: StudyRecord, in_flight: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Rebuild and write ``results.csv``; returns its rows."""
    rows = collect_results(record, in_flight)
    write_results(record, rows)
    return rows
