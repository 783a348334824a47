"""``RunSummary``: what a run reports about itself in ``summary.json``.

The trainer writes it (at start, at every checkpoint and at the end); study results, reports and
analysis read it. It is the only interface between a run and what comes after, so it is typed:
a field renamed on one side fails validation on the other, and the tests construct it.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator, model_validator

from headwise.config import atomic_write_text
from headwise.plans import Plan
from headwise.run.layout import RunDir


class RunStatus(str, Enum):
    """Where a run stands. ``pending`` and ``failed``-without-summary are a study's view of a run
    directory; the trainer itself writes running, completed, interrupted, diverged or failed."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    DIVERGED = "diverged"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class RunSummary(BaseModel):
    """One run's summary: its outcome, its model's plan and size, and how fast it trained."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)

    status: RunStatus
    #: the last evaluation loss, when the run completed (None otherwise)
    final_eval_loss: float | None = None
    #: the latest evaluation loss, whatever the status
    last_eval_loss: float | None = None
    #: the task's other metrics at that evaluation (e.g. ``pick_accuracy``)
    eval_metrics: dict[str, float] = {}
    params: int
    d_model: int | None = None
    plan: Plan
    wall_time_s: float = 0.0
    #: what ``tokens``, ``tokens_per_s``, ``tokens_per_step`` and ``flops_per_token`` count: the
    #: task's unit (tokens; points for vector tasks; images for image classification)
    unit: str = "tokens"
    #: training time, excluding evaluation and checkpoints
    train_time_s: float = 0.0
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    mfu: float | None = None
    flops_per_token: int | None = None
    #: bytes the key/value cache grows by per token, by cache dtype (``{"fp32": ..., "bf16": ...}``;
    #: :func:`headwise.params.kv_cache_budget`); None for bidirectional models, which keep no cache
    kv_cache_bytes_per_token: dict[str, int] | None = None
    peak_flops: float | None = None
    peak_flops_source: str | None = None
    steps: int = 0
    total_steps: int | None = None
    tokens: int = 0
    tokens_per_step: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    world_size: int = 1
    device: str = "cpu"
    precision: str = "fp32"
    #: facts the task records about itself (see :meth:`headwise.tasks.base.Task.describe`)
    task: dict[str, Any] = {}
    #: a fine-tuning run's source: ``{"run": ..., "checkpoint": ...}`` (``[train] init_from``)
    init_from: dict[str, Any] | None = None
    #: a text run's tokenizer (spec, vocab_size, eot_id, sha256), saved in the run folder when the
    #: run starts (:mod:`headwise.run.tokenizer`); None for other runs and runs of older headwise
    tokenizer: dict[str, Any] | None = None
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_older_layout(cls, data: Any) -> Any:
        # Summaries written before the plan was typed kept heads at the top level and a plan
        # only for [model.plan] runs; read them as the same plan.
        if isinstance(data, dict) and ("heads" in data or data.get("plan") is None):
            data = dict(data)
            heads, head_dims = data.pop("heads", None), data.pop("head_dims", None)
            data.pop("total_heads", None)
            old = data.get("plan") or {}
            if isinstance(old, dict) and "heads" not in old and heads is not None:
                data["plan"] = {"scheme": old.get("scheme", "explicit"), "heads": heads, "head_dims": head_dims or [],
                                "requested_total": old.get("requested_total"), "notes": old.get("notes") or []}
        return data

    @field_validator("plan", mode="before")
    @classmethod
    def _plan_from_dict(cls, value: Any) -> Any:
        return Plan.from_dict(value) if isinstance(value, dict) else value

    @field_serializer("plan")
    def _plan_to_dict(self, plan: Plan) -> dict[str, Any]:
        return plan.to_dict()

    @property
    def heads(self) -> tuple[int, ...]:
        return self.plan.heads

    @property
    def head_dims(self) -> tuple[int, ...]:
        return self.plan.head_dims

    @property
    def total_heads(self) -> int:
        return self.plan.total

    @property
    def n_layers(self) -> int:
        return self.plan.n_layers

    def to_json(self) -> str:
        """The ``summary.json`` text."""
        data = self.model_dump(mode="json")
        # only some runs have them (no KV cache: bidirectional models): other summaries stay as they were
        for key in ("init_from", "tokenizer", "kv_cache_bytes_per_token"):
            if data[key] is None:
                del data[key]
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "RunSummary":
        """Parse ``summary.json`` text (raises ``ValueError`` when it is not a summary)."""
        return cls.model_validate(json.loads(text))


def write_summary(run_dir: str | Path, summary: RunSummary) -> None:
    """Write a run's ``summary.json`` atomically."""
    atomic_write_text(RunDir(run_dir).summary, summary.to_json())


def read_summary(run_dir: str | Path) -> RunSummary | None:
    """A run's summary, or None when it has none or it cannot be read as one."""
    try:
        return RunSummary.from_json(RunDir(run_dir).summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
