"""Task families, registered in one place each.

A family is a kind of task: language modelling, the nearest-neighbour target, images, Long Range
Arena sequences, masked-LM pretraining and GLUE fine-tuning (the encoder family registers both).
Everything the rest of headwise needs to know about a family is in its :class:`TaskFamily` record:

- ``config``: its ``[task]`` table (a :class:`TaskConfigBase` subclass whose ``kind`` field is the
  family's name), which knows the task's shape without preparing data, prepares the data once
  for a study, and builds the task (a :class:`~headwise.tasks.base.Task`: batches, loss, metrics);
- ``inputs``/``outputs``: the model front end its task's inputs need and the output head its loss
  scores (names of the model's parts, :mod:`headwise.parts`), as the task declares them too;
- ``report_layout``: the report layout its studies use unless the study file names one (a name
  in the registry of :mod:`headwise.report`);
- ``generates_text``: its models continue text (``headwise generate`` writes text, ``headwise
  eval`` scores them with lm-evaluation-harness, exported models get a generation config, reports
  show samples);
- ``caches``: the cache classes its data is kept in, which ``headwise data info`` and ``list``
  read.

What a family's runs can do besides is asked of its config, never of its kind: whether a run has
a tokenizer (:meth:`TaskConfigBase.run_tokenizer`), held-out text
(:meth:`TaskConfigBase.held_out_texts`), text options for ``headwise data``
(:meth:`TaskConfigBase.data_options`), a cache of its own (:meth:`TaskConfigBase.cache`), the
metrics it records (:meth:`TaskConfigBase.reported_metrics`), the runs whose vocabulary it
reads (:attr:`TaskConfigBase.vocabulary_kinds`) or whether a ``[task]`` table without ``kind`` is
its own (:attr:`TaskConfigBase.kind_optional`). The tasks on text share their config base
(:mod:`headwise.tasks.text`) and task base (:mod:`headwise.tasks.token_task`).

A family's record and config are declarations, read without torch (a study's dry run, the
``[task]`` union); its task, which batches and scores with torch, is imported by the config's
``build`` alone.

A new family is a folder of :mod:`headwise.families` (or a package named by a
``headwise.families`` entry point) whose task module ends with ``register_family(TaskFamily(...))``;
:data:`FAMILIES` imports every family package the first time it is asked for a kind it does not
hold or for its list, which makes ``[task] kind = "..."`` valid everywhere.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, NamedTuple

from headwise.config import Config
from headwise.registry import Registry
from headwise.tasks.base import TaskShape

if TYPE_CHECKING:
    from headwise.tasks.base import Task
    from headwise.text.tokenizer import Tokenizer


class Dims(NamedTuple):
    """The sizes a task's config knows before its data exists (see
    :class:`~headwise.tasks.base.TaskShape`)."""

    #: the vocabulary of token inputs; None for other inputs
    vocab_size: int | None
    #: the length of one example in the task's own units
    seq_len: int
    #: the width of vector inputs (the model's d_model); None for other inputs
    input_dim: int | None = None


class TaskConfigBase(Config):
    """Base of every ``[task]`` table; subclasses add ``kind: Literal["name"]`` and their fields."""

    kind: str
    #: a ``[task]`` table that names no kind is this family's (at most one family says so:
    #: :func:`headwise.tasks.union.implied_kind`)
    kind_optional: ClassVar[bool] = False
    #: the task kinds of the runs whose vocabulary this table can read (a fine-tuning task's
    #: :meth:`vocabulary_run`), so that a study refuses a stage on other runs when it is resolved;
    #: None where the family does not say
    vocabulary_kinds: ClassVar[tuple[str, ...] | None] = None

    @property
    def family(self) -> "TaskFamily":
        """The family this config belongs to."""
        return family_of(self.kind)

    def shape(self) -> TaskShape:
        """The task's shape, from the config alone."""
        family = self.family
        vocab_size, seq_len, input_dim = self.dims()
        return TaskShape(family.inputs, family.outputs, vocab_size, seq_len, input_dim, self.spec_fields())

    @abstractmethod
    def dims(self) -> Dims:
        """The task's :class:`Dims` as the built task will have them (a plain
        ``(vocab_size, seq_len, input_dim)`` tuple is read the same way)."""

    def spec_fields(self) -> dict[str, Any]:
        """Model fields the data dictates (see :class:`~headwise.tasks.base.TaskShape`), as far as
        the config knows them without the data: what it cannot know (an image folder's class
        count) is checked against the built task."""
        return {}

    def setup_line(self, facts: dict[str, Any]) -> str:
        """The task in a few words for a report's set-up line, given the facts a run recorded
        (:meth:`~headwise.tasks.base.Task.describe`, kept in its summary)."""
        return f"{self.kind} task ({facts.get('data') or self.data_description() or 'generated data'})"

    def data_description(self) -> str | None:
        """What :meth:`prepare` makes ready, in a few words; None when the task makes its data
        on the fly and there is nothing to prepare."""
        return None

    def prepare(self, progress: bool = False) -> None:
        """Make the task's data ready (download, tokenize, cache) so that runs only open it.
        Raises HeadwiseError when the data cannot be had."""

    @abstractmethod
    def build(self, cache_dir: str | Path | None = None, progress: bool = False) -> Task:
        """The task itself, its data prepared (or reused from the cache)."""

    def cache(self, cache_dir: str | Path | None = None, rebuild: bool = False, progress: bool = False) -> Any:
        """The task's own verified cache (one of its family's ``caches``), built or reused; None
        when the task has none, or prepares its data from :meth:`data_options` instead."""
        return None

    def cache_info(self, cache_dir: str | Path | None = None) -> dict[str, Any] | None:
        """For ``headwise data info --config``: where this table's own cache is and whether it is
        ready, without building it; None when the task has no such cache."""
        return None

    def reported_metrics(self) -> tuple[str, ...] | None:
        """The eval metrics besides the loss that runs of this table record, known from the config
        alone (a study's claims and tuning metric are checked against them); None when only the
        built task knows them. By default none: a family whose task has ``metric_names`` names
        them here."""
        return ()

    def vocabulary_run(self) -> str | None:
        """The pretraining run whose vocabulary this table's inputs are encoded in (a fine-tuning
        task's), which ``[train] init_from`` must name too; None for tasks with their own."""
        return None

    def data_options(self) -> dict[str, Any] | None:
        """The text data request of this table, as ``headwise data``'s options name it (a
        :class:`~headwise.text.data_plan.DataConfig`'s fields); None for tasks without
        text to tokenize."""
        return None

    def run_tokenizer(self, run_dir: Path) -> "Tokenizer | None":
        """The tokenizer a run of this task trained with (named here or saved in ``run_dir``);
        None for tasks without one."""
        return None

    def held_out_texts(self) -> Iterator[str] | None:
        """The validation documents, which a run's model never trained on; None for tasks
        without text."""
        return None


@dataclass(frozen=True)
class TaskFamily:
    """A family's record: its ``[task]`` config, the model front end and output head its task
    needs, its studies' report layout, and what it can do (see the module docstring)."""

    kind: str
    config: type[TaskConfigBase]
    inputs: str
    outputs: str
    report_layout: str
    #: its models continue text
    generates_text: bool = False
    #: the cache classes its data is kept in, for ``headwise data info`` and ``list``: each has
    #: ``KIND`` (the ``kind`` its ``meta.json`` records; None for caches that record none),
    #: ``open(path, verify=...)``, ``summary()`` (a dict) and ``headline(summary)`` (one line)
    caches: tuple[type, ...] = ()


def _discover() -> None:
    # imported here, not at the top: the family packages import this module
    from headwise.families import load_families

    load_families()


#: the registered families by kind; a family registers on import of its package
FAMILIES: Registry[TaskFamily] = Registry("task kind", discover=_discover)


def register_family(family: TaskFamily) -> TaskFamily:
    """Add a family to the registry under its kind (once per kind); returns it."""
    return FAMILIES.register(family.kind, family)


def families() -> dict[str, TaskFamily]:
    """Every family by kind, each family package imported (see :mod:`headwise.families`)."""
    return dict(FAMILIES.items())


def family_of(kind: str) -> TaskFamily:
    """The registered family of a ``[task] kind``; an unknown kind is a one-line HeadwiseError
    naming the kinds."""
    return FAMILIES.get(kind)
