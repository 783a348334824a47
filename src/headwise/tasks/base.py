"""The interface every task gives the trainer, so that the trainer does not care which it runs.

A task turns a data source into batches and says how to score a model's output:

    stream = task.train_stream(micro_batch, seed=..., rank=r, world_size=w)
    batch = next(stream)                      # Batch(inputs, targets) on the CPU
    loss = task.loss(model(batch.inputs), batch.targets)
    state = stream.state_dict()               # saved in checkpoints, restored exactly
    for batch in task.eval_batches(): ...     # a fixed held-out set, the same every call
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator

from torch import Tensor


@dataclass
class Batch:
    """One micro-batch. ``inputs`` goes to the model; ``targets`` to :meth:`Task.loss`."""

    inputs: Tensor
    targets: Tensor

    def to(self, device: Any) -> "Batch":
        return Batch(self.inputs.to(device, non_blocking=True), self.targets.to(device, non_blocking=True))


class BatchStream(ABC, Iterator[Batch]):
    """An endless, seeded stream of training batches whose position can be saved and restored."""

    @property
    @abstractmethod
    def epoch(self) -> float:
        """Fractional number of passes over the training data so far (0.0 for endless tasks)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream exactly where it is."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state returned by :meth:`state_dict`."""


class Task(ABC):
    """A training objective with its data."""

    #: "lm" (token ids in, logits out) or "vectors" (float vectors in, vectors out)
    io: str

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

    @abstractmethod
    def tokens_per_epoch(self) -> int | None:
        """Training tokens in one pass over the data (None for endless tasks)."""

    def describe(self) -> dict[str, Any]:
        """Facts about the task worth recording in a run's summary (e.g. the baseline loss)."""
        return {}
