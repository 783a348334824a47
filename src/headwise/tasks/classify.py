"""What the classification tasks (images, Long Range Arena sequences) share: cross-entropy over
class logits, top-1 accuracy and, above 10 classes, top-5 accuracy. The metric names are
declarations their configs read without torch, which this module loads only to score."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwise.tasks.base import Batch, Task

if TYPE_CHECKING:
    from torch import Tensor

#: top-5 accuracy is reported only above this many classes (with 10 or fewer it says little).
TOP5_ABOVE = 10


def topk_accuracy(logits: Tensor, targets: Tensor, k: int) -> Tensor:
    """The share of rows whose target is among the ``k`` largest logits."""
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    return (top == targets[:, None]).any(dim=-1).float().mean()


def accuracy_metrics(num_classes: int) -> tuple[str, ...]:
    """The metrics of a task with ``num_classes`` classes: ``accuracy``, and ``top5_accuracy`` above
    :data:`TOP5_ABOVE` classes."""
    return ("accuracy",) + (("top5_accuracy",) if num_classes > TOP5_ABOVE else ())


class ClassificationTask(Task):
    """A task whose model returns class logits ``[B, classes]`` for targets ``[B]`` of class ids;
    a subclass sets ``metric_names`` with :func:`accuracy_metrics`."""

    outputs = "classes"

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of class logits ``[B, classes]`` against class ids ``[B]`` (in fp32)."""
        import torch.nn.functional as F

        return F.cross_entropy(outputs.float(), targets)

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``accuracy`` (top-1) and, when the task reports it, ``top5_accuracy``."""
        ks = {"accuracy": 1, "top5_accuracy": 5}
        return {name: topk_accuracy(outputs, batch.targets, ks[name]) for name in self.metric_names}
