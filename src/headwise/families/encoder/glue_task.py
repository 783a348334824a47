"""GLUE fine-tuning tasks: sentence (pair) rows in a masked-LM run's vocabulary, scored over whole
evaluation splits.

Inputs are ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` in the pretraining run's vocabulary
(:class:`~headwise.text.masked_vocab.MaskedVocab`), the longer text trimmed first to fit
``max_length`` (Hugging Face's ``longest_first`` truncation, which cramming's tokenizer applies)
and padded with ``[PAD]`` = 0, which the model's ``pad_id`` masks out of attention. cramming
gives a single sentence an empty second text (``[CLS] a [SEP] [SEP]``, its
``data/downstream_task_preparation.py``); here it is ``[CLS] a [SEP]``.

Metrics are computed once over each WHOLE evaluation split by
:mod:`headwise.families.encoder.metrics`, although the trainer only averages per-batch values
weighted by batch size (:meth:`~headwise.tasks.base.Task.finish_metrics`):

- classification (:class:`GlueFinetuneTask`): each batch reports its share of every (split,
  label, prediction) cell; the averages are the confusion matrices over the evaluation set's
  size, from which the label and prediction arrays are rebuilt and scored (accuracy, F1 and
  Matthews correlation depend on the confusion matrix alone). Several splits are scored at once
  (MNLI: ``validation_matched`` gives ``accuracy``, ``validation_mismatched`` gives
  ``accuracy_mismatched``, as cramming evaluates one fine-tuned model on both); an evaluation
  target is ``label + num_classes * split``, a training target the label;
- regression (:class:`GlueRegressionTask`, STS-B): the model's one output is the predicted score,
  trained with the mean squared error as cramming (and Hugging Face) train a one-label head. Each
  batch reports every example's prediction under its own row of the split (the others 0), so the
  averages are the whole split's predictions over its size, from which Pearson and Spearman are
  computed; a target is ``(score, row)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headwise.data.batch import Batch, BatchStream
from headwise.data.shuffled import ShuffledStream
from headwise.families.encoder.glue import Examples
from headwise.families.encoder.metrics import METRICS
from headwise.tasks.base import Task
from headwise.text.masked_vocab import CLS_ID, PAD_ID, SEP_ID, MaskedVocab
from headwise.text.tokenizer import Tokenizer


def encode_pair(vocab: MaskedVocab, a: str, b: str | None, max_length: int) -> list[int]:
    """``[CLS] a [SEP] (b [SEP])`` as ids, the longer text trimmed from its end, one token at a
    time, until the row fits ``max_length`` (not padded)."""
    ids_a = vocab.from_cache(np.array(vocab.tokenizer.encode(a), dtype=np.int64)).tolist()
    ids_b = [] if b is None else vocab.from_cache(np.array(vocab.tokenizer.encode(b), dtype=np.int64)).tolist()
    budget = max_length - (2 if b is None else 3)
    la, lb = len(ids_a), len(ids_b)
    while la + lb > budget:
        if la >= lb:
            la -= 1
        else:
            lb -= 1
    row = [CLS_ID, *ids_a[:la], SEP_ID]
    return row if b is None else row + [*ids_b[:lb], SEP_ID]


def encode_rows(vocab: MaskedVocab, texts: tuple[list[str], ...], max_length: int) -> Tensor:
    """Every example as a row of ``max_length`` ids padded with ``[PAD]`` (int64 ``[N, max_length]``)."""
    seconds = texts[1] if len(texts) > 1 else [None] * len(texts[0])
    out = torch.full((len(texts[0]), max_length), PAD_ID, dtype=torch.int64)
    for i, (a, b) in enumerate(zip(texts[0], seconds)):
        row = encode_pair(vocab, a, b, max_length)
        out[i, :len(row)] = torch.tensor(row)
    return out


class GlueFinetuneTask(Task):
    """Classification of encoded sentence (pair) rows; training targets are class ids.

    ``evaluation`` maps a metric suffix to a split's examples: the first split's metrics are
    named plainly (``accuracy``), a later one's with its suffix (``accuracy_mismatched``)."""

    inputs = "tokens"
    outputs = "cls_pooler"

    def __init__(self, name: str, vocab: MaskedVocab, train: Examples, evaluation: dict[str, Examples],
                 num_classes: int, metrics: tuple[str, ...], max_length: int = 128, eval_batch_size: int = 32,
                 origin: str = "") -> None:
        self.name, self.vocab, self.max_length, self.num_classes = name, vocab, max_length, num_classes
        self.metric_list, self.origin = metrics, origin
        self.train_inputs = encode_rows(vocab, train.texts, max_length)
        self.train_targets = self.targets(train, 0, 0)
        self.split_sizes = {suffix: len(split) for suffix, split in evaluation.items()}
        self.num_eval = sum(self.split_sizes.values())
        self._eval: list[Batch] = []
        start = 0
        for k, split in enumerate(evaluation.values()):
            inputs, targets = encode_rows(vocab, split.texts, max_length), self.targets(split, k, start)
            self._eval += [Batch(inputs=inputs[i:i + eval_batch_size], targets=targets[i:i + eval_batch_size])
                           for i in range(0, len(split), eval_batch_size)]
            start += len(split)
        self.metric_names = self.names(len(evaluation))

    def targets(self, examples: Examples, split: int, start: int) -> Tensor:
        """The targets of one split's examples (``start``: the split's first row in the evaluation set)."""
        return torch.as_tensor(examples.labels, dtype=torch.int64) + self.num_classes * split

    def names(self, splits: int) -> tuple[str, ...]:
        """The per-batch metric names: one per (split, label, prediction) cell."""
        c = self.num_classes
        return tuple(f"cell_{k}_{t}_{p}" for k in range(splits) for t in range(c) for p in range(c))

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def tokenizer(self) -> Tokenizer:
        """The pretraining run's tokenizer under the vocabulary (what the run saves)."""
        return self.vocab.tokenizer

    @property
    def seq_len(self) -> int:
        return self.max_length

    def spec_fields(self) -> dict[str, Any]:
        return {"causal": False, "num_classes": self.num_classes, "pad_id": PAD_ID}

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        # each epoch ends at its last whole batch, as cramming's DataLoader (drop_last=True)
        return ShuffledStream(len(self.train_targets), self._train_batch, micro_batch, seed, rank, world_size,
                              kind="examples", drop_last=True)

    def _train_batch(self, index: np.ndarray, generator: torch.Generator) -> Batch:
        rows = torch.from_numpy(index)
        return Batch(inputs=self.train_inputs[rows], targets=self.train_targets[rows])

    def eval_batches(self) -> list[Batch]:
        return list(self._eval)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return nn.functional.cross_entropy(outputs.float(), targets % self.num_classes)

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Each (split, label, prediction) cell's share of the batch."""
        c = self.num_classes
        cells = (batch.targets // c) * c * c + (batch.targets % c) * c + outputs.argmax(-1)
        shares = torch.bincount(cells, minlength=len(self.metric_names)).double() / len(cells)
        return dict(zip(self.metric_names, shares))

    def finish_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """The task's metrics over each whole split, from the confusion matrices ``means`` gives."""
        c, out = self.num_classes, {}
        for k, suffix in enumerate(self.split_sizes):
            counts = [round(means[f"cell_{k}_{t}_{p}"] * self.num_eval) for t in range(c) for p in range(c)]
            labels = np.repeat(np.arange(c * c) // c, counts)
            predictions = np.repeat(np.arange(c * c) % c, counts)
            out.update({name + (f"_{suffix}" if suffix else ""): METRICS[name](predictions, labels)
                        for name in self.metric_list})
        return out

    def batch_score(self, outputs: Tensor, batch: Batch) -> tuple[str, float]:
        """The batch's accuracy (its split's cells are not a score on their own)."""
        return "accuracy", float((outputs.argmax(-1) == batch.targets % self.num_classes).double().mean())

    def predictions(self, outputs: Tensor, batch: Batch) -> tuple[str, list, list]:
        n = min(16, outputs.shape[0])
        return (f"the first {n} examples' classes", outputs[:n].argmax(-1).tolist(),
                (batch.targets[:n] % self.num_classes).tolist())

    def tokens_per_epoch(self) -> int:
        return len(self.train_targets) * self.max_length

    def describe(self) -> dict[str, Any]:
        return {"task": "glue", "glue_task": self.name, "data": self.origin, "vocab_size": self.vocab_size,
                "max_length": self.max_length, "train_examples": len(self.train_targets),
                "eval_examples": self.split_sizes, "num_classes": self.num_classes,
                "metrics": list(self.metric_list), "baseline_loss": self.baseline_loss()}

    def baseline_loss(self) -> float:
        """The loss of a model that knows nothing: uniform over the classes."""
        return float(np.log(self.num_classes))


class GlueRegressionTask(GlueFinetuneTask):
    """A regression (STS-B): one output, the predicted score, trained with the squared error."""

    def targets(self, examples: Examples, split: int, start: int) -> Tensor:
        rows = torch.arange(start, start + len(examples), dtype=torch.float32)
        return torch.stack([torch.as_tensor(examples.labels, dtype=torch.float32), rows], dim=1)

    def names(self, splits: int) -> tuple[str, ...]:
        return tuple(f"prediction_{i}" for i in range(self.num_eval))

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return nn.functional.mse_loss(outputs.float()[:, 0], targets[:, 0].float())

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Each example's prediction over the batch size, under its row (the other rows 0)."""
        shares = torch.zeros(self.num_eval, dtype=torch.float64, device=outputs.device)
        shares[batch.targets[:, 1].long()] = outputs[:, 0].double() / len(outputs)
        return dict(zip(self.metric_names, shares))

    def finish_metrics(self, means: dict[str, float]) -> dict[str, float]:
        predictions = np.array([means[name] for name in self.metric_names]) * self.num_eval
        labels = np.concatenate([b.targets[:, 0].numpy() for b in self._eval]).astype(np.float64)
        return {name: METRICS[name](predictions, labels) for name in self.metric_list}

    def batch_score(self, outputs: Tensor, batch: Batch) -> tuple[str, float]:
        """The batch's Pearson correlation (NaN for a batch of constant scores)."""
        return "pearson", METRICS["pearson"](outputs[:, 0].double().numpy(), batch.targets[:, 0].double().numpy())

    def predictions(self, outputs: Tensor, batch: Batch) -> tuple[str, list, list]:
        n = min(16, outputs.shape[0])
        return (f"the first {n} examples' scores", [round(x, 3) for x in outputs[:n, 0].tolist()],
                batch.targets[:n, 0].tolist())

    def baseline_loss(self) -> float:
        """The squared error of predicting the mean training score: the scores' variance."""
        return float(np.var(self.train_targets[:, 0].numpy()))
