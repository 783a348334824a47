"""The results table of a study: one typed row per run, read from the run directories.

``results.csv`` is rebuilt from disk (each run's summary and resolved config) every time a run
finishes, so it is never out of step with the runs themselves. Rows stay typed
(:class:`RunResult`, carrying the run's :class:`~headwise.plans.Plan`) until they are written.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.locks import held
from headwise.plans import Plan
from headwise.run import RunDir, RunStatus, RunSummary, read_summary
from headwise.study.layout import RESULTS_CSV, StudyRecord, run_paths

#: Columns after the variant, the seed and one column per axis; the task's eval metrics
#: (``eval_accuracy``, ``eval_top5``, ...: whichever the study's runs report) follow
#: ``final_eval_loss``. ``unit`` says what ``per_s`` and ``seen`` count (tokens; images; points).
COLUMNS = [
    "scheme", "heads", "total_heads", "n_layers", "d_model", "head_dims", "params", "final_eval_loss",
    "wall_time_s", "train_time_s", "unit", "per_s", "peak_memory_mb", "steps", "seen", "status",
    "run_dir", "error",
]


def read_run_config(path: Path) -> dict[str, Any] | None:
    """A run's resolved ``config.toml``, or None."""
    p = RunDir(path).config
    if not p.is_file():
        return None
    try:
        return read_toml(p)
    except HeadwiseError:
        return None


def run_status(path: Path, in_flight: bool = False, attempted: bool = False) -> RunStatus:
    """pending (never started), running, failed (started but left no summary), or the
    summary's status; a run that says ``running`` but has no live process was killed, and is
    reported as ``interrupted``."""
    path = Path(path)
    if in_flight:
        return RunStatus.RUNNING
    summary = read_summary(path)
    if summary is None:
        if attempted:
            return RunStatus.FAILED
        return RunStatus.INTERRUPTED if path.exists() and any(path.iterdir()) else RunStatus.PENDING
    if summary.status in (RunStatus.RUNNING, RunStatus.PENDING):
        return RunStatus.INTERRUPTED
    return summary.status


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


def axis_names(record: StudyRecord) -> list[str]:
    """The axis columns of a study, in the order they first appear."""
    return list(dict.fromkeys(k for v in record.variants for k in v.get("labels", {}) if k != "variant"))


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class RunResult:
    """One run of a study as its directory stands: the variant, the seed, the axis labels, the
    run's status and, once it has written one, its summary."""

    variant: str
    seed: int
    labels: dict[str, str]
    status: RunStatus
    run_dir: str
    summary: RunSummary | None = None
    config: dict[str, Any] | None = None
    error: str = ""

    @property
    def plan(self) -> Plan | None:
        """The run's head plan (from its summary), or None before it has written one."""
        return None if self.summary is None else self.summary.plan

    @property
    def final_eval_loss(self) -> float | None:
        return None if self.summary is None else _finite(self.summary.final_eval_loss)

    def csv_row(self, axes: list[str]) -> dict[str, Any]:
        """The row of ``results.csv``: the axis labels, then :data:`COLUMNS`."""
        s, plan, model = self.summary, self.plan, (self.config or {}).get("model", {})
        peak = _finite(s.peak_memory_bytes) if s else None
        row: dict[str, Any] = {"variant": self.variant, "seed": self.seed}
        row.update({axis_column(axis): self.labels.get(axis, "") for axis in axes})
        row.update(
            scheme=plan.scheme.value if plan else "",
            heads=" ".join(map(str, plan.heads if plan else model.get("heads") or [])),
            total_heads=plan.total if plan else "",
            n_layers=plan.n_layers if plan else model.get("n_layers", ""),
            d_model=(s.d_model if s and s.d_model else model.get("d_model", "")),
            head_dims=" ".join(map(str, plan.head_dims)) if plan else "",
            params=s.params if s else "",
            final_eval_loss=self.final_eval_loss,
            wall_time_s=_finite(s.wall_time_s) if s else None,
            train_time_s=_finite(s.train_time_s) if s else None,
            unit=s.unit if s else "",
            per_s=_finite(s.tokens_per_s) if s else None,
            peak_memory_mb=None if peak is None else round(peak / 2**20, 1),
            steps=s.steps if s else "",
            seen=s.tokens if s else "",
            status=self.status.value,
            run_dir=self.run_dir,
            error=self.error,
        )
        # the metrics of the last evaluation, as the summary has them (a completed run's are final)
        row.update({f"eval_{k}": _finite(v) for k, v in (s.eval_metrics if s else {}).items()})
        return row

    @property
    def metric_names(self) -> list[str]:
        """The task's eval metrics this run reports (``accuracy``, ``top5``, ...)."""
        return list(self.summary.eval_metrics) if self.summary is not None else []


def run_result(record: StudyRecord, variant: dict[str, Any], seed: int, in_flight: bool = False) -> RunResult:
    """One run's result, from whatever its directory holds so far: live while its worker holds
    the run's lock, failed when it was started (it has a log) but left no summary."""
    paths = run_paths(record.path, variant["name"], seed)
    rd, log = paths["run_dir"], paths["log_path"]
    summary = read_summary(rd)
    status = run_status(rd, in_flight or held(paths["lock_path"]), attempted=log.is_file())
    error = (summary.error if summary else None) or (last_error(log) if status is RunStatus.FAILED else "")
    return RunResult(variant=variant["name"], seed=seed, labels=dict(variant.get("labels", {})), status=status,
                     run_dir=str(rd.relative_to(record.path)), summary=summary, config=read_run_config(rd),
                     error=str(error).replace("\n", " ")[:300])


def collect_results(record: StudyRecord, in_flight: Iterable[str] = ()) -> list[RunResult]:
    """Results of every run of the study; ``in_flight`` holds ``variant/seedK`` keys now running."""
    live = set(in_flight)
    return [run_result(record, v, s, f"{v['name']}/seed{s}" in live) for v, s in record.runs()]


def axis_column(axis: str) -> str:
    """The ``results.csv`` column of an axis's labels: its name, or ``<name>_label`` for an axis
    named like one of :data:`COLUMNS` (a study's ``scheme`` axis beside the plan's typed scheme:
    one column name each, so neither hides the other)."""
    return f"{axis}_label" if axis in COLUMNS or axis in ("variant", "seed") else axis


def results_csv(record: StudyRecord, results: list[RunResult]) -> str:
    """The text of ``results.csv`` for these results."""
    axes = axis_names(record)
    metrics = [f"eval_{m}" for m in dict.fromkeys(m for r in results for m in r.metric_names)]
    at = COLUMNS.index("final_eval_loss") + 1
    return rows_to_csv([r.csv_row(axes) for r in results],
                       ["variant", "seed", *map(axis_column, axes), *COLUMNS[:at], *metrics, *COLUMNS[at:]])


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


def update_results(record: StudyRecord, in_flight: Iterable[str] = ()) -> list[RunResult]:
    """Rebuild and write ``results.csv`` (atomically); returns the results."""
    results = collect_results(record, in_flight)
    atomic_write_text(record.path / RESULTS_CSV, results_csv(record, results))
    return results
