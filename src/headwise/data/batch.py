"""The batch types every task hands the trainer, defined here so that the data layer (which
produces them, :mod:`headwise.text.packing`) does not depend on the tasks that use it.

:mod:`headwise.tasks.base` re-exports both; tasks and the trainer may import them from either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # annotations only: the data layer is read (configs, dry runs) without torch
    from torch import Tensor


@dataclass
class Batch:
    """One micro-batch. ``inputs`` goes to the model; ``targets`` to the task's loss."""

    inputs: Tensor
    targets: Tensor

    def to(self, device: Any) -> "Batch":
        """Both tensors on ``device`` (copied asynchronously where the device allows it)."""
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
