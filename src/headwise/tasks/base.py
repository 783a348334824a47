"""The interface every task gives the trainer, so that the trainer does not care which it runs.

A task turns a data source into batches and says how to score a model's output:

    stream = task.train_stream(micro_batch, seed=..., rank=r, world_size=w)
    batch = next(stream)                      # Batch(inputs, targets) on the CPU
    loss = task.train_loss(model, batch)      # task.loss(model(batch.inputs, pad_vocab=True), ...)
    state = stream.state_dict()               # saved in checkpoints, restored exactly
    for batch in task.eval_batches(): ...     # a fixed held-out set, the same every call
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Batch and BatchStream live in the data layer, which produces them; re-exported as part of the
# interface tasks give the trainer.
from headwise.data.batch import Batch, BatchStream

if TYPE_CHECKING:  # annotations only: a task's shape and config are read without torch
    from torch import Tensor

__all__ = ["Batch", "BatchStream", "Task", "TaskShape"]


@dataclass(frozen=True)
class TaskShape:
    """What a model must fit of a task: what :func:`headwise.train.config.resolve_spec` reads.
    A task's config knows it before any data is prepared; the task itself knows it exactly."""

    #: the model front end the inputs need and the output head the loss scores (names registered
    #: in headwise.model)
    inputs: str
    outputs: str
    #: the vocabulary of token inputs; None for other inputs
    vocab_size: int | None
    seq_len: int
    #: the width of vector inputs, which is the model's d_model; None for other inputs
    input_dim: int | None = None
    #: other model fields the data dictates (an image task's image_size, channels, num_classes)
    spec_fields: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A training objective with its data."""

    #: the model front end this task's inputs need and the output head its loss scores
    inputs: str
    outputs: str
    #: what the trainer counts (``tokens`` in the summary and logs): tokens, points, images
    unit: str = "tokens"
    #: the keywords the model's forward takes besides the inputs: a vocabulary's logits padded
    #: (a task without one, whose model may be another library's, passes none)
    forward_options: dict[str, Any] = {"pad_vocab": True}

    @property
    @abstractmethod
    def vocab_size(self) -> int | None:
        """Vocabulary size for token tasks; None for vector tasks."""

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Length of each input sequence (block size, or number of points)."""

    @abstractmethod
    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        """Training batches for one data-parallel rank (each rank sees a disjoint share)."""

    @abstractmethod
    def eval_batches(self) -> list[Batch]:
        """The fixed held-out evaluation set, identical on every call."""

    @abstractmethod
    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean loss of a model's outputs against the targets (a scalar tensor)."""

    def train_loss(self, model: Callable[..., Tensor], batch: Batch) -> Tensor:
        """The loss the trainer minimises on ``batch``: by default :meth:`loss` of
        ``model(batch.inputs, **forward_options)``. ``model`` is the trainer's forward (the
        Transformer, or its DDP or ``torch.compile`` wrapper). A task that scores only part of
        the outputs may compute only that part here (a masked LM decodes its masked positions)."""
        return self.loss(model(batch.inputs, **self.forward_options), batch.targets)

    def evaluate(self, model: Callable[..., Tensor], batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss and :meth:`metrics` of ``model`` on a held-out ``batch``, which the trainer's
        evaluation averages: by default both from ``model(batch.inputs, **forward_options)`` (no
        metrics when :attr:`metric_names` is empty); see :meth:`train_loss`."""
        outputs = model(batch.inputs, **self.forward_options)
        return self.loss(outputs, batch.targets), (self.metrics(outputs, batch) if self.metric_names else {})

    @abstractmethod
    def tokens_per_epoch(self) -> int | None:
        """Training tokens (the task's :attr:`unit`) in one pass over the data (None for endless tasks)."""

    @property
    def input_dim(self) -> int | None:
        """The width of vector inputs (None for other inputs)."""
        return None

    def spec_fields(self) -> dict[str, Any]:
        """Model fields the data dictates besides the vocabulary and vector width (see
        :class:`TaskShape`)."""
        return {}

    def shape(self) -> TaskShape:
        """What a model must fit of this task."""
        return TaskShape(self.inputs, self.outputs, self.vocab_size, self.seq_len, self.input_dim,
                         self.spec_fields())

    #: the names of :meth:`metrics`, the same for every batch
    metric_names: tuple[str, ...] = ()

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Evaluation metrics besides the loss (one per :attr:`metric_names`), each a scalar
        tensor averaged over ``batch``, e.g. accuracy; logged as ``eval_<name>``."""
        return {}

    def finish_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """The metrics a run records, from :meth:`metrics` averaged over the whole evaluation set
        (weighted by batch size); by default those averages themselves. A task whose metrics are
        not averages (F1, correlations) reports sufficient statistics per batch and combines
        them here."""
        return means

    def batch_score(self, outputs: Tensor, batch: Batch) -> tuple[str, float]:
        """The headline metric over one batch and its name (what ``headwise generate`` shows for a
        non-text model): by default the first of :meth:`metrics`."""
        name = self.metric_names[0]
        return name, float(self.metrics(outputs, batch)[name])

    def predictions(self, outputs: Tensor, batch: Batch) -> tuple[str, list, list]:
        """What ``headwise generate`` shows of a non-text model's outputs on a held-out batch: a
        few words on what the lists are, the model's answers and the right ones. By default the
        largest logit of the first 16 examples (a classifier's predicted class) and their targets."""
        n = min(16, outputs.shape[0])
        return (f"the first {n} examples' classes", outputs[:n].argmax(-1).tolist(), batch.targets[:n].tolist())

    def describe(self) -> dict[str, Any]:
        """Facts about the task worth recording in a run's summary (e.g. the baseline loss)."""
        return {}
