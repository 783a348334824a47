"""The ``[task]`` table of a run config, and building the task it describes.

    [task]                     # kind defaults to "lm"
    source = "tinystories-train-sample.txt"
    tokenizer = "bpe:4096"
    validation = "tinystories-valid-sample.txt"

    [task]
    kind = "nearest"
    dim = 16
    n_points = 8
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from headwise.config import Config
from headwise.data.cache import prepare
from headwise.data.plan import DataConfig
from headwise.data.tokenizer import GPT_NEO_VOCAB, parse_tokenizer_spec
from headwise.errors import HeadwiseError
from headwise.tasks.base import Task
from headwise.tasks.lm import LMTask
from headwise.tasks.nearest import NearestNeighbourTask


@dataclass(frozen=True)
class TaskShape:
    """What the model must fit of a task, known from its config alone (no data prepared): what
    :func:`headwise.train.config.resolve_spec` reads of a task."""

    io: str
    vocab_size: int | None
    seq_len: int
    #: the width of a vector task's inputs (the model's d_model); None for token tasks
    input_dim: int | None = None


class LMTaskConfig(DataConfig):
    """Language modelling on text (see :class:`~headwise.data.plan.DataConfig` for the data fields)."""

    kind: Literal["lm"] = "lm"
    #: tokens per training sequence (each block holds block_size + 1 tokens)
    block_size: int = Field(default=256, gt=0)
    #: evaluation batches (0: every validation block)
    eval_batches: int = Field(default=8, ge=0)
    eval_batch_size: int = Field(default=8, gt=0)

    def shape(self) -> TaskShape:
        """Token ids in, next-token logits out; ``bpe:N`` learns N tokens, ``gpt-neo`` has its own."""
        return TaskShape("lm", parse_tokenizer_spec(self.tokenizer) or GPT_NEO_VOCAB, self.block_size)


class NearestTaskConfig(Config):
    """Amsel et al.'s nearest-neighbour target on the unit sphere."""

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

    def shape(self) -> TaskShape:
        """Points (and, for query-nearest, queries flagged by an extra coordinate) in, vectors out."""
        query = self.variant == "query-nearest"
        queries = (self.n_queries or self.n_points) if query else 0
        return TaskShape("vectors", None, self.n_points + queries, self.dim + (1 if query else 0))


def _task_kind(value: Any) -> str | None:
    # A [task] table without `kind` is a language task.
    if isinstance(value, dict):
        return value.get("kind", "lm")
    return getattr(value, "kind", None)


TaskConfig = Annotated[
    Union[Annotated[LMTaskConfig, Tag("lm")], Annotated[NearestTaskConfig, Tag("nearest")]],
    Discriminator(_task_kind),
]


TASK_CONFIGS: dict[str, type[Config]] = {"lm": LMTaskConfig, "nearest": NearestTaskConfig}


def parse_task_config(data: dict[str, Any], source: str = "[task]") -> LMTaskConfig | NearestTaskConfig:
    """Validate a ``[task]`` table on its own, raising a one-line HeadwiseError on failure."""
    kind = _task_kind(data)
    cls = TASK_CONFIGS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise HeadwiseError(f"{source}: unknown task kind {kind!r}; use one of: {', '.join(TASK_CONFIGS)}")
    return cls.parse(data, source=source)  # type: ignore[return-value]


def build_task(
    cfg: LMTaskConfig | NearestTaskConfig, cache_dir: str | Path | None = None, progress: bool = False
) -> Task:
    """The task a config describes; a language task prepares (or reuses) its token cache."""
    if isinstance(cfg, NearestTaskConfig):
        return NearestNeighbourTask(
            dim=cfg.dim,
            n_points=cfg.n_points,
            variant=cfg.variant,
            n_queries=cfg.n_queries,
            eval_batches=cfg.eval_batches,
            eval_batch_size=cfg.eval_batch_size,
            eval_seed=cfg.eval_seed,
        )
    cache = prepare(cfg, cache_dir=cache_dir, progress=progress)
    return LMTask(cache, block_size=cfg.block_size, eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size)
