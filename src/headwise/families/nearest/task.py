"""The nearest-neighbour target of Amsel, Yehudai & Bruna (ICLR 2025): its ``[task]`` table
(registers the family). The task itself, which draws the samples and scores them (see
:mod:`~headwise.families.nearest.nearest_task`), is imported when the table builds it; its
"learned nothing" loss is :mod:`~headwise.families.nearest.baseline`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from headwise.tasks.family import Dims, TaskConfigBase, TaskFamily, register_family

if TYPE_CHECKING:
    from headwise.families.nearest.nearest_task import NearestNeighbourTask

class NearestTaskConfig(TaskConfigBase):
    """``[task]`` of Amsel et al.'s nearest-neighbour target on the unit sphere."""

    kind: Literal["nearest"] = "nearest"
    #: dimension d of the points (the model's d_model; d + 1 for query-nearest)
    dim: int = Field(default=16, ge=2)
    #: points per sample (the sequence length, plus the queries for query-nearest)
    n_points: int = Field(default=8, ge=2)
    variant: Literal["farthest", "query-nearest"] = "farthest"
    #: queries per sample for query-nearest (default: n_points)
    n_queries: int | None = Field(default=None, ge=1)
    eval_batches: int = Field(default=4, ge=1)
    eval_batch_size: int = Field(default=256, ge=1)
    eval_seed: int = 1234

    @model_validator(mode="after")
    def _check(self) -> "NearestTaskConfig":
        if self.n_queries is not None and self.variant != "query-nearest":
            raise ValueError("n_queries applies only to variant 'query-nearest'")
        return self

    def dims(self) -> Dims:
        """No vocabulary; points (and, for query-nearest, queries flagged by an extra coordinate)."""
        query = self.variant == "query-nearest"
        queries = (self.n_queries or self.n_points) if query else 0
        return Dims(None, self.n_points + queries, self.dim + (1 if query else 0))

    def reported_metrics(self) -> tuple[str, ...]:
        """``pick_accuracy``: the share of scored tokens whose output is closest to the right point."""
        return ("pick_accuracy",)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return f"nearest-neighbour task, d = {self.dim}, N = {self.n_points} points ({self.variant})"

    def build(self, cache_dir: str | Path | None = None, progress: bool = False) -> NearestNeighbourTask:
        """The task; its samples are drawn on the fly, so there is no data to prepare."""
        from headwise.families.nearest.nearest_task import NearestNeighbourTask

        return NearestNeighbourTask(dim=self.dim, n_points=self.n_points, variant=self.variant,
                                    n_queries=self.n_queries, eval_batches=self.eval_batches,
                                    eval_batch_size=self.eval_batch_size, eval_seed=self.eval_seed)


NEAREST_FAMILY = register_family(TaskFamily(kind="nearest", config=NearestTaskConfig, inputs="vectors",
                                            outputs="vectors", report_layout="rank"))
