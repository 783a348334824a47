"""Masked-LM pretraining on a token cache (the task
:class:`~headwise.families.encoder.task.MLMTaskConfig` builds): ``[CLS] ... [SEP]`` rows masked
80/10/10 (:mod:`~headwise.families.encoder.masking`), scored by the masked positions'
cross-entropy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

from headwise.errors import HeadwiseError
from headwise.families.encoder.masking import MaskedStream, batch_generator, mask_tokens, rows_of
from headwise.model.loss import IGNORE_INDEX, cross_entropy, masked_lm_loss
from headwise.tasks.base import Batch, BatchStream
from headwise.tasks.token_task import TokenCacheTask
from headwise.text.masked_vocab import MaskedVocab
from headwise.text.token_cache import TokenCache


#: the seed of the held-out masking, the same for every run so that eval losses compare
EVAL_MASK_SEED = 0


class MLMTask(TokenCacheTask):
    """Masked language modelling: inputs are masked rows ``[B, block_size]``, targets the
    labels (original ids at the masked positions, -100 elsewhere); the model (``outputs =
    "mlm"``) returns logits ``[B, block_size, vocab]``, or, in training and evaluation, the logits
    of the masked positions alone.

    Evaluation as :class:`~headwise.tasks.token_task.TokenCacheTask` says, the rows masked once with a
    fixed generator."""

    kind = "mlm"
    outputs = "mlm"
    metric_names = ("masked_accuracy",)
    #: [CLS] and [SEP]
    specials = 2
    row_words = "row of block_size - 1"

    def __init__(self, cache: TokenCache, block_size: int = 128, mask_rate: float = 0.25,
                 eval_batches: int = 8, eval_batch_size: int = 8) -> None:
        if block_size < 3 or eval_batch_size < 1 or eval_batches < 0:
            raise HeadwiseError(
                f"block_size ({block_size}) must be at least 3 ([CLS], a token, [SEP]) and eval_batch_size "
                f"({eval_batch_size}) at least 1, eval_batches ({eval_batches}) at least 0"
            )
        # what the evaluation batches, made by the base's __init__, read
        self.mask_rate, self.vocab = mask_rate, MaskedVocab(cache.tokenizer)
        super().__init__(cache, block_size, eval_batches, eval_batch_size)

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    def spec_fields(self) -> dict[str, Any]:
        """A masked LM sees both sides: its model is not causal."""
        return {"causal": False}

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return MaskedStream(self.cache.tokens("train"), self.vocab, self.block_size, self.mask_rate, micro_batch,
                            seed, rank, world_size)

    def _eval_batch(self, tokens: np.ndarray, blocks: np.ndarray, first: int) -> Batch:
        rows = rows_of(tokens, blocks, self.block_size, self.vocab)
        inputs, labels = mask_tokens(rows, self.mask_rate, self.vocab_size, batch_generator(EVAL_MASK_SEED, first, 0))
        return Batch(inputs=inputs, targets=labels)

    def train_loss(self, model: Callable[..., Tensor], batch: Batch) -> Tensor:
        """:func:`headwise.model.loss.masked_lm_loss`: the model decodes only the masked positions
        (a quarter of the rows at 25% masking), the value :meth:`loss` gives from full logits."""
        return masked_lm_loss(model, batch.inputs, batch.targets)

    def evaluate(self, model: Callable[..., Tensor], batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss and ``masked_accuracy`` from the masked positions' logits alone, as in training
        (the values :meth:`loss` and :meth:`metrics` give from full logits)."""
        rows = batch.targets != IGNORE_INDEX
        logits, labels = model(batch.inputs, pad_vocab=True, select=rows), batch.targets[rows]
        return cross_entropy(logits, labels), {"masked_accuracy": _accuracy(logits, labels)}

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of full logits ``[B, T, V]`` at the masked positions (labels other
        than -100), by :func:`headwise.model.loss.cross_entropy` (for ``headwise generate``;
        training and evaluation decode only the masked positions: :meth:`train_loss`)."""
        logits, labels = outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1)
        rows = labels != IGNORE_INDEX
        return cross_entropy(logits[rows], labels[rows], IGNORE_INDEX)

    def metrics(self, outputs: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``masked_accuracy`` of full logits: the share of masked positions whose largest logit
        is the original id."""
        rows = batch.targets != IGNORE_INDEX
        return {"masked_accuracy": _accuracy(outputs[rows], batch.targets[rows])}

    def predictions(self, outputs: Tensor, batch: Batch) -> tuple[str, list, list]:
        """The model's guesses at the first masked positions of a held-out batch and the right ids."""
        rows = batch.targets != IGNORE_INDEX
        guesses, truth = outputs[rows][:16].argmax(-1), batch.targets[rows][:16]
        return ("the first 16 masked tokens", [self.vocab.decode([int(g)]) for g in guesses],
                [self.vocab.decode([int(t)]) for t in truth])

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "mask_rate": self.mask_rate,
            "train_tokens": self.cache.num_tokens("train"),
            "tokens_per_epoch": self.tokens_per_epoch(),
            "eval_masked_tokens": int(sum((b.targets != IGNORE_INDEX).sum() for b in self._eval)),
            "baseline_loss": float(np.log(self.vocab_size)),
        }


def _accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """The share of rows of ``logits`` [N, V] whose largest entry is the row's label."""
    return (logits.argmax(-1) == labels).float().mean()
