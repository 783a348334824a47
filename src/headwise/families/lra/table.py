"""The Long Range Arena task table: one row per task, the single source of its facts.

Every LRA fact that depends on the task (its default source, standard length, vocabulary with
padding, classes, whether examples are pairs, whether the data exists only in the
LRA release's files) is read from :data:`TASKS` by the readers, the sequence cache and the
``[task]`` config alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from headwise.errors import HeadwiseError
from headwise.families.lra import listops as lo

#: the padding id of every task (ids start at 1)
PAD_ID = 0
SPLITS = ("train", "val", "test")
#: the share of training carved off as validation where a source has no validation split
VAL_FRACTION = 0.1


@dataclass(frozen=True)
class LRATask:
    """One LRA task's facts."""

    #: the default source: "generate" (ListOps), a hub name, or a name under $HEADWISE_DATA
    source: str
    #: LRA's standard length (images: their pixel count); per document for paired tasks
    max_length: int
    #: vocabulary, padding included
    vocab_size: int
    num_classes: int
    #: examples are pairs of documents (the model's token_pairs front end)
    pairs: bool = False
    #: the data exists only in the LRA release's files: a ``[task]`` table must name them
    #: (``source`` is then the release folder's usual name under $HEADWISE_DATA)
    release_only: bool = False


TASKS: dict[str, LRATask] = {
    "listops": LRATask("generate", 2000, lo.VOCAB_SIZE, lo.NUM_CLASSES),
    "text": LRATask("stanfordnlp/imdb", 4000, 257, 2),
    "retrieval": LRATask("aan", 4000, 257, 2, pairs=True, release_only=True),
    "image": LRATask("uoft-cs/cifar10", 1024, 257, 10),
    "pathfinder": LRATask("pathfinder32", 1024, 257, 2, release_only=True),
    "fashion-mnist": LRATask("fashion-mnist", 784, 257, 10),
}


def check_task(task: str) -> str:
    """``task`` when it is in :data:`TASKS`; otherwise a one-line HeadwiseError."""
    if task not in TASKS:
        raise HeadwiseError(f"unknown LRA task {task!r}: use one of {', '.join(TASKS)}")
    return task
