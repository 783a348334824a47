"""Language modelling on a token cache: packed blocks in, next-token cross-entropy out (the task
:class:`~headwise.families.lm.task.LMTaskConfig` builds)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from headwise.errors import HeadwiseError
from headwise.model.loss import cross_entropy
from headwise.tasks.base import Batch, BatchStream
from headwise.tasks.token_task import TokenCacheTask
from headwise.text.packing import PackedStream, gather_blocks
from headwise.text.token_cache import TokenCache


class LMTask(TokenCacheTask):
    """Next-token prediction: inputs and targets are int64 ``[B, block_size]`` token ids; the model
    returns logits ``[B, block_size, vocab]``. A block holds ``block_size + 1`` tokens (the targets
    are the inputs shifted by one); evaluation as :class:`~headwise.tasks.token_task.TokenCacheTask` says.
    """

    kind = "lm"
    outputs = "lm"
    row_words = "block of block_size + 1"

    def __init__(
        self, cache: TokenCache, block_size: int = 256, eval_batches: int = 8, eval_batch_size: int = 8
    ) -> None:
        if block_size < 1 or eval_batch_size < 1 or eval_batches < 0:
            raise HeadwiseError(
                f"block_size ({block_size}) and eval_batch_size ({eval_batch_size}) must be at least 1, "
                f"eval_batches ({eval_batches}) at least 0"
            )
        super().__init__(cache, block_size, eval_batches, eval_batch_size)

    @property
    def vocab_size(self) -> int:
        return self.cache.vocab_size

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return PackedStream(self.cache.tokens("train"), self.block_size, micro_batch, seed, rank, world_size)

    def _eval_batch(self, tokens: np.ndarray, blocks: np.ndarray, first: int) -> Batch:
        return gather_blocks(tokens, blocks, self.block_size)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of logits ``[B, T, V]`` against target ids ``[B, T]`` (in fp32), by
        :func:`headwise.model.loss.cross_entropy`: no fp32 copy of bf16 logits, no zero-filled
        gradient (the loss of [1024, 50,304] logits runs ~2.5x faster in bf16, ~1.5x in fp32).

        The logits may carry -inf columns past the vocabulary (the trainer asks the model for
        ``pad_vocab=True`` logits): they add nothing to the softmax, so the loss is the same."""
        return cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))

    def describe(self) -> dict[str, Any]:
        meta = self.cache.meta
        return {
            **super().describe(),
            "train_tokens": self.cache.num_tokens("train"),
            "valid_tokens": self.cache.num_tokens("valid"),
            "train_documents": meta["splits"]["train"]["documents"],
            "tokens_per_epoch": self.tokens_per_epoch(),
            "eval_tokens": sum(b.targets.numel() for b in self._eval),
        }
