"""A study's runs as the report reads them: typed (each run's :class:`~headwise.run.RunSummary`
and :class:`~headwise.plans.Plan`), grouped by variant, plus the run facts that series are drawn
from.

A series is a fact of the runs themselves (the plan's scheme, its depth, a config value), never a
label string: relabelling an axis in the study file changes the variant names, not the series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.report import stats
from headwise.run import RunStatus, RunSummary, read_metrics
from headwise.study.layout import StudyRecord
from headwise.study.results import RunResult, collect_results
from headwise.study.stages import saved_stages, stage_record
from headwise.tasks.union import parse_task_config
from headwise.tasks.family import TaskConfigBase


@dataclass(frozen=True)
class RunRecord:
    """One run of the study: its result (status, summary, resolved config), where it lives, and
    its task config (None before the run has written its config)."""

    result: RunResult
    path: Path
    task: TaskConfigBase | None

    @property
    def seed(self) -> int:
        return self.result.seed

    @property
    def status(self) -> RunStatus:
        return self.result.status

    @property
    def summary(self) -> RunSummary | None:
        return self.result.summary

    @property
    def config(self) -> dict[str, Any]:
        return self.result.config or {}

    def final(self, metric: str = "loss") -> float | None:
        """A completed run's final eval ``metric`` (``loss``, else one of its ``eval_metrics``);
        None for another run, or where the value is missing or not finite."""
        s = self.summary
        if self.status is not RunStatus.COMPLETED or s is None:
            return None
        value = s.final_eval_loss if metric == "loss" else s.eval_metrics.get(metric)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    @property
    def loss(self) -> float | None:
        """The final eval loss of a completed run (None otherwise)."""
        return self.final()

    @property
    def lr(self) -> float | None:
        return self.config.get("optim", {}).get("lr")

    @property
    def generates_text(self) -> bool:
        """Whether the run's task family writes text (see :class:`~headwise.tasks.family.TaskFamily`)."""
        return self.task is not None and self.task.family.generates_text

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of the run's ``metrics.jsonl``."""
        return read_metrics(self.path)


@dataclass
class VariantRuns:
    """A variant of the study and its runs (one per seed)."""

    name: str
    labels: dict[str, str]
    runs: list[RunRecord]

    @property
    def done(self) -> list[RunRecord]:
        """The completed runs (those with a final eval loss)."""
        return [r for r in self.runs if r.loss is not None]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.done]  # type: ignore[misc]

    @property
    def stats(self) -> stats.SeedStats:
        return stats.seed_stats(self.losses)

    @property
    def info(self) -> RunRecord | None:
        """A run with a summary (for the shape, which every seed shares)."""
        return next((r for r in self.runs if r.summary is not None), None)

    @property
    def plan(self) -> Plan | None:
        run = self.info
        return None if run is None else run.summary.plan  # type: ignore[union-attr]

    @property
    def heads(self) -> list[int]:
        return list(self.plan.heads) if self.plan else []

    @property
    def head_dims(self) -> list[int]:
        return list(self.plan.head_dims) if self.plan else []

    @property
    def total_heads(self) -> int | None:
        return self.plan.total if self.plan else None

    @property
    def n_layers(self) -> int | None:
        return self.plan.n_layers if self.plan else None

    @property
    def uniform(self) -> bool:
        """The same heads and head width in every layer."""
        return bool(self.heads) and len(set(self.heads)) == 1 and len(set(self.head_dims)) <= 1

    @property
    def params(self) -> int | None:
        run = self.info
        return None if run is None else run.summary.params  # type: ignore[union-attr]

    @property
    def d_model(self) -> int | None:
        run = self.info
        if run is None:
            return None
        return run.summary.d_model or run.config.get("model", {}).get("d_model")  # type: ignore[union-attr]

    @property
    def task(self) -> TaskConfigBase | None:
        run = self.info
        return None if run is None else run.task

    @property
    def n_points(self) -> int | None:
        """Points per sample of a task that has them (the nearest-neighbour task's ``n_points``);
        None otherwise."""
        return getattr(self.task, "n_points", None)

    def mean(self, field: str) -> float | None:
        """The mean of a numeric summary field over the completed runs."""
        vals = [float(getattr(r.summary, field)) for r in self.done
                if isinstance(getattr(r.summary, field, None), (int, float))]
        return float(np.mean(vals)) if vals else None

    @property
    def peak_mb(self) -> float | None:
        v = self.mean("peak_memory_bytes")
        return None if v is None else v / 2**20


@dataclass(frozen=True)
class Fact:
    """A fact of a variant's runs, and the run-config key that decides it (to find the axes
    that vary it)."""

    key: str
    value: Callable[[VariantRuns], Any]


#: Facts a series can be named by, from the runs' summaries and configs.
FACTS: dict[str, Fact] = {
    "scheme": Fact("model.plan.scheme", lambda v: v.plan.scheme.value if v.plan else None),
    "n_layers": Fact("model.n_layers", lambda v: v.n_layers),
    "total_heads": Fact("model.plan.total_heads", lambda v: v.total_heads),
    "heads_per_layer": Fact("model.heads", lambda v: v.heads[0] if v.uniform else None),
    "head_dim": Fact("model.head_dim", lambda v: v.head_dims[0] if v.uniform and v.head_dims else None),
    "d_model": Fact("model.d_model", lambda v: v.d_model),
    "n_points": Fact("task.n_points", lambda v: v.n_points),
}


def _config_value(v: VariantRuns, key: str) -> Any:
    node: Any = v.info.config if v.info else {}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _overlaps(a: str, b: str) -> bool:
    """One dotted key is the other or lies inside it (``model.plan`` and ``model.plan.scheme``)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


@dataclass(frozen=True)
class Series:
    """What splits a study into series: a fact of each variant, and the axes that vary it."""

    fact: Fact
    axes: frozenset[str]

    def value(self, v: VariantRuns) -> str | None:
        """The series a variant belongs to (None before any of its runs wrote a summary)."""
        x = self.fact.value(v)
        return None if x is None else str(x)

    def group(self, v: VariantRuns) -> tuple[tuple[str, str], ...]:
        """The variant's place on the other axes: variants of one group differ only in series."""
        return tuple((axis, label) for axis, label in v.labels.items() if axis not in self.axes)


@dataclass
class StudyRuns:
    """Every variant of a study with whatever its runs have written."""

    record: StudyRecord
    variants: list[VariantRuns]

    @property
    def done(self) -> list[VariantRuns]:
        """Variants with at least one completed run."""
        return [v for v in self.variants if v.done]

    @property
    def unit(self) -> str:
        """What the runs count (tokens; images for image classification): their summaries' unit."""
        return next((r.summary.unit for v in self.variants for r in v.runs if r.summary is not None), "tokens")

    @property
    def task(self) -> TaskConfigBase | None:
        """The study's task: that of its first run with a config, else its base config's."""
        ran = next((r.task for v in self.variants for r in v.runs if r.task is not None), None)
        return ran if ran is not None else _task_of(self.record.definition.get("base"))

    def axis_keys(self) -> dict[str, set[str]]:
        """The run-config keys each axis of the study sets."""
        definition = self.record.definition
        axes = list(definition.get("axes", []))
        for grid in definition.get("grids", []):
            axes += grid.get("axes", [])
        out: dict[str, set[str]] = {}
        for axis in axes:
            keys = out.setdefault(axis["name"], set())
            if axis.get("key"):
                keys.add(axis["key"])
            keys.update(k for value in axis.get("values", []) if isinstance(value, dict)
                        for k in value.get("set", {}))
        return out

    def series(self, name: str) -> Series:
        """The series named in ``[report]``: a run fact (:data:`FACTS`), an axis that sets one
        config key (the value it sets), or a dotted config key."""
        axis_keys = self.axis_keys()
        if name in FACTS:
            fact = FACTS[name]
        elif name in axis_keys and len(axis_keys[name]) == 1:
            key = next(iter(axis_keys[name]))
            fact = Fact(key, lambda v: _config_value(v, key))
        elif "." in name:
            fact = Fact(name, lambda v: _config_value(v, name))
        else:
            raise HeadwiseError(
                f"[report] series {name!r} is not a run fact ({', '.join(FACTS)}), an axis of the study that sets "
                "one key, or a dotted config key (e.g. optim.lr)")
        varying = frozenset(a for a, keys in axis_keys.items() if any(_overlaps(k, fact.key) for k in keys))
        return Series(fact, varying)


def load_study_runs(record: StudyRecord) -> StudyRuns:
    """Every variant of the study and its runs, read from the run directories (nothing is written)."""
    by_name: dict[str, VariantRuns] = {
        v["name"]: VariantRuns(v["name"], dict(v.get("labels", {})), []) for v in record.variants}
    for result in collect_results(record):
        by_name[result.variant].runs.append(
            RunRecord(result, record.path / result.run_dir, _task_of(result.config)))
    return StudyRuns(record, list(by_name.values()))


def _task_of(config: dict[str, Any] | None) -> TaskConfigBase | None:
    """The run's task config; None when the run has not written its config (or it no longer parses)."""
    if not config or "task" not in config:
        return None
    try:
        return parse_task_config(config["task"])
    except HeadwiseError:
        return None


def load_stage_runs(record: StudyRecord) -> dict[str, StudyRuns]:
    """Each ``[[stages]]`` entry's runs, by stage name (empty for a study without stages)."""
    return {s.name: load_study_runs(stage_record(record, s.name)) for s in saved_stages(record)}
