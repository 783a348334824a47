"""Long Range Arena's ``[task]`` table (``kind = "lra"``, registers the family): which LRA task,
its data and how it is read (ListOps' generator settings, validation splits, grayscale). Its
task, :class:`~headwise.families.lra.sequence_task.SequenceTask`, is imported when the table
builds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.families.lra.cache import SequenceCache, prepare_sequences
from headwise.families.lra.listops import listops_config
from headwise.families.lra.sequences import GRAYSCALES, SPLIT_RULES
from headwise.families.lra.table import PAD_ID, TASKS
from headwise.tasks.base import TaskShape
from headwise.tasks.classify import accuracy_metrics
from headwise.tasks.family import Dims, TaskConfigBase, TaskFamily, register_family

if TYPE_CHECKING:
    from headwise.families.lra.sequence_task import SequenceTask


class ListOpsConfig(Config):
    """``[task.listops]``: how ListOps is generated (see :mod:`headwise.families.lra.listops`): a variant
    (``standard``: LRA's 96k/2k/2k of 500-2000 tokens; ``short``: 20k/2k/2k of 20-100 tokens for
    CPU studies) with any of its settings overridden."""

    variant: Literal["standard", "short"] = "standard"
    n_train: int | None = Field(default=None, gt=0)
    n_val: int | None = Field(default=None, gt=0)
    n_test: int | None = Field(default=None, gt=0)
    #: kept when min_length < tokens < max_length
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, gt=1)
    max_depth: int | None = Field(default=None, gt=0)
    max_args: int | None = Field(default=None, ge=2)
    seed: int | None = None

    def request(self) -> dict[str, Any]:
        """The variant and the settings given, as :func:`headwise.families.lra.cache.prepare_sequences` takes them."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def resolved(self) -> dict[str, int]:
        """Every generator setting."""
        overrides = self.request()
        return listops_config(overrides.pop("variant"), **overrides)


#: the tasks whose tokens are pixels (``task.grayscale`` applies to them)
PIXEL_TASKS = ("image", "pathfinder", "fashion-mnist")


class LRATaskConfig(TaskConfigBase):
    """``[task]`` of a Long Range Arena task::

        [task]
        kind = "lra"
        task = "listops"            # listops, text, retrieval, image, pathfinder, fashion-mnist
        max_length = 2000
        listops = { variant = "standard" }
        splits = "carved"           # or "lra": validation as LRA's pipelines make it
        grayscale = "pillow"        # pixel tasks: or "tf" (tf.image.rgb_to_grayscale, LRA's)
    """

    kind: Literal["lra"] = "lra"
    task: Literal[tuple(TASKS)]  # type: ignore[valid-type]
    #: the data: "generate" (ListOps), a path, a name under $HEADWISE_DATA, or a hub dataset;
    #: None: the task's default (retrieval and pathfinder have none: give the LRA release's files)
    source: str | None = None
    #: tokens per sequence (per document for retrieval), longer ones truncated; None: the task's
    max_length: int | None = Field(default=None, gt=0)
    listops: ListOpsConfig = ListOpsConfig()
    train_examples: int | None = Field(default=None, gt=0)
    eval_examples: int | None = Field(default=None, gt=0)
    #: the split evaluated: "test" (reported), or "val" (for choosing settings, e.g. a study's [nuisance])
    eval_split: Literal["test", "val"] = "test"
    #: how validation is made where the source has none: "carved" (a seeded 10% of training) or "lra"
    #: (LRA's pipelines: IMDb validates on test; images on the last 10% of training)
    splits: Literal[SPLIT_RULES] = "carved"  # type: ignore[valid-type]
    #: RGB images to gray: "pillow" (Pillow's L, rounded) or "tf" (tf.image.rgb_to_grayscale, LRA's)
    grayscale: Literal[GRAYSCALES] = "pillow"  # type: ignore[valid-type]
    eval_batch_size: int = Field(default=32, gt=0)
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _listops_generated(self) -> "LRATaskConfig":
        # (a resolved config writes the default table back: only settings given count)
        if self.listops != ListOpsConfig() and (self.task != "listops" or self.source not in (None, "generate")):
            raise ValueError("task.listops configures generated ListOps (task = 'listops', source = 'generate'): "
                             "remove it for other data")
        if self.grayscale != "pillow" and self.task not in PIXEL_TASKS:
            raise ValueError(f"task.grayscale applies to the pixel tasks ({', '.join(PIXEL_TASKS)}), not "
                             f"{self.task}: remove it")
        return self

    @property
    def length(self) -> int:
        """The resolved ``max_length``."""
        if self.max_length is not None:
            return self.max_length
        if self.task == "listops" and self.data_source == "generate":
            return self.listops.resolved()["max_length"]
        return TASKS[self.task].max_length

    @property
    def data_source(self) -> str:
        """The resolved source; a HeadwiseError when the task has no default."""
        row = TASKS[self.task]
        source = self.source or (None if row.release_only else row.source)
        if source is None:
            raise HeadwiseError(f"[task] task = {self.task!r} has no public default source: set task.source to the "
                                "LRA release's files (see headwise.families.lra.readers)")
        return source

    def dims(self) -> Dims:
        """The task's vocabulary (with padding), ``max_length``, no vector inputs."""
        return Dims(TASKS[self.task].vocab_size, self.length)

    def shape(self) -> TaskShape:
        """Token sequences, or pairs of them for retrieval, classified."""
        vocab, seq_len, _ = self.dims()
        pairs = TASKS[self.task].pairs
        return TaskShape("token_pairs" if pairs else "tokens", "pair_classes" if pairs else "classes",
                         vocab, seq_len * (2 if pairs else 1), None, self.spec_fields())

    def spec_fields(self) -> dict[str, Any]:
        return {"num_classes": TASKS[self.task].num_classes, "pad_id": PAD_ID}

    def reported_metrics(self) -> tuple[str, ...]:
        """Accuracy, and top-5 accuracy for a task of more than 10 classes."""
        return accuracy_metrics(TASKS[self.task].num_classes)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return (f"LRA {self.task} on {facts.get('data') or self.source}, {facts.get('classes', '?')} classes, "
                f"sequences padded to {self.length} tokens (mean training length "
                f"{facts.get('mean_train_length', float('nan')):.0f}), {facts.get('train_examples', '?')} training "
                f"and {facts.get('eval_examples', '?')} eval examples")

    def data_description(self) -> str:
        return f"LRA {self.task} ({self.data_source}, up to {self.length} tokens)"

    def prepare(self, progress: bool = False) -> None:
        """Generate or read the data into the sequence cache (or check the cache already there)."""
        self.cache(progress=progress)

    def cache(self, cache_dir: str | Path | None = None, rebuild: bool = False, progress: bool = False) -> SequenceCache:
        """The sequence cache of this table's data, built or reused."""
        listops = self.listops.request() if self.task == "listops" and self.data_source == "generate" else None
        return prepare_sequences(self.task, source=self.data_source, max_length=self.length, listops=listops,
                                 cache_dir=cache_dir or self.cache_dir, rebuild=rebuild, progress=progress,
                                 splits=self.splits, grayscale=self.grayscale)

    def build(self, cache_dir: str | Path | None = None, progress: bool = False) -> SequenceTask:
        """The task on the sequence cache, which is prepared (or reused) first."""
        from headwise.families.lra.sequence_task import SequenceTask

        return SequenceTask(self.cache(cache_dir, progress=progress), self.length,
                            train_examples=self.train_examples, eval_examples=self.eval_examples,
                            eval_batch_size=self.eval_batch_size, eval_split=self.eval_split)


LRA_FAMILY = register_family(TaskFamily(kind="lra", config=LRATaskConfig, inputs="tokens", outputs="classes",
                                        report_layout="lra", caches=(SequenceCache,)))
