"""Long Range Arena sequence classification: token sequences (or pairs of them) in, class logits out
(the task :class:`~headwise.families.lra.task.LRATaskConfig` builds).

The tasks (Tay et al., 2021, as Leaner Transformers runs them with Nyströmformers): ``listops``
(generated here, :mod:`headwise.families.lra.listops`), ``text`` (IMDb bytes), ``retrieval`` (pairs of
AAN documents, bytes), ``image`` (CIFAR-10 as grayscale pixel tokens), ``pathfinder`` (32 x 32
pixel tokens), and ``fashion-mnist`` (sequential Fashion-MNIST, 784 pixel tokens: the offline
stand-in for ``image``). Token id 0 is padding everywhere (:mod:`headwise.families.lra.readers`); every
sequence is padded to ``max_length``, and the model (``pad_id = 0``, bidirectional) ignores the
padding in attention and pooling. Targets are class ids ``[B]``; ``retrieval``'s inputs are
``[B, 2, max_length]`` (the model's ``token_pairs`` front end), the others' ``[B, max_length]``.

Training order is a :class:`~headwise.data.shuffled.ShuffledStream` over the training split;
evaluation reads the test split (or evenly spaced examples of it; ``eval_split = "val"`` reads the
validation split instead, for choosing settings on data the report does not compare on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headwise.data.shuffled import ShuffledStream, evenly_spaced
from headwise.errors import HeadwiseError
from headwise.families.lra.cache import SequenceCache
from headwise.families.lra.table import PAD_ID
from headwise.tasks.base import Batch, BatchStream
from headwise.tasks.classify import ClassificationTask, accuracy_metrics


class SequenceTask(ClassificationTask):
    """Classification of cached token sequences, padded to ``max_length`` (see the module docstring)."""

    inputs = "tokens"

    def __init__(self, cache: SequenceCache, max_length: int, *, train_examples: int | None = None,
                 eval_examples: int | None = None, eval_batch_size: int = 32, eval_split: str = "test") -> None:
        self.cache, self.max_length, self.eval_batch_size = cache, max_length, eval_batch_size
        self.eval_split = eval_split
        if cache.max_length > max_length:
            raise HeadwiseError(f"the cached sequences reach {cache.max_length} tokens, more than max_length "
                                f"{max_length}: prepare the data with max_length {max_length}")
        self.pairs = cache.pairs
        if self.pairs:  # retrieval: two documents per example
            self.inputs, self.outputs = "token_pairs", "pair_classes"
        self.train_index = evenly_spaced(cache.num_examples("train"), train_examples)
        self.eval_index = evenly_spaced(cache.num_examples(eval_split), eval_examples)
        self.metric_names = accuracy_metrics(cache.num_classes)

    @property
    def vocab_size(self) -> int:
        return self.cache.vocab_size

    @property
    def seq_len(self) -> int:
        """Tokens an example is: ``max_length``, twice for pairs (every document is padded to it)."""
        return self.max_length * (2 if self.pairs else 1)

    def spec_fields(self) -> dict[str, Any]:
        """The class count and the padding id the model must mask."""
        return {"num_classes": self.cache.num_classes, "pad_id": PAD_ID}

    def batch(self, split: str, index: np.ndarray) -> Batch:
        """Examples ``index`` of ``split``, padded with :data:`PAD_ID` to ``max_length``."""
        shape = (len(index), 2, self.max_length) if self.pairs else (len(index), self.max_length)
        tokens = np.full(shape, PAD_ID, dtype=np.int64)
        for row, i in enumerate(index):
            docs = self.cache.pair(split, int(i)) if self.pairs else (self.cache.sequence(split, int(i)),)
            for j, doc in enumerate(docs):
                target = tokens[row, j] if self.pairs else tokens[row]
                target[:len(doc)] = doc
        labels = np.asarray(self.cache.labels(split)[index], dtype=np.int64)
        return Batch(inputs=torch.from_numpy(tokens), targets=torch.from_numpy(labels))

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return ShuffledStream(len(self.train_index), self._train_batch, micro_batch, seed, rank, world_size,
                              kind="sequences")

    def _train_batch(self, picked: np.ndarray, generator: torch.Generator) -> Batch:
        return self.batch("train", self.train_index[picked])

    def eval_batches(self) -> Sequence[Batch]:
        size = self.eval_batch_size
        return [self.batch(self.eval_split, self.eval_index[i:i + size]) for i in range(0, len(self.eval_index), size)]

    def tokens_per_epoch(self) -> int:
        """Padded positions in one pass over the training examples (both documents of a pair)."""
        return len(self.train_index) * self.seq_len

    def describe(self) -> dict[str, Any]:
        c = self.cache
        lengths = c.lengths("train")
        return {
            "task": "lra",
            "data": c.description,
            "cache": str(c.path),
            "classes": c.num_classes,
            "vocab_size": c.vocab_size,
            "max_length": self.max_length,
            "pairs": self.pairs,
            "train_examples": len(self.train_index),
            "eval_examples": len(self.eval_index),
            "mean_train_length": float(np.mean(lengths)) if len(lengths) else 0.0,
            "chance_accuracy": 1 / c.num_classes,
        }
