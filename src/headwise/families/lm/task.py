"""Language modelling on a token cache: packed blocks in, next-token cross-entropy out."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field
from torch import Tensor

from headwise.errors import HeadwiseError
from headwise.model.loss import cross_entropy
from headwise.tasks.base import Batch, BatchStream
from headwise.tasks.family import Dims, TaskFamily, register_family
from headwise.tasks.text import TextTaskConfig, TokenCacheTask
from headwise.text.packing import PackedStream, gather_blocks
from headwise.text.token_cache import TokenCache

class LMTask(TokenCacheTask):
    """Next-token prediction: inputs and targets are int64 ``[B, block_size]`` token ids; the model
    returns logits ``[B, block_size, vocab]``. A block holds ``block_size + 1`` tokens (the targets
    are the inputs shifted by one); evaluation as :class:`~headwise.tasks.text.TokenCacheTask` says.
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


class LMTaskConfig(TextTaskConfig):
    """``[task]`` of language modelling on text (see :class:`~headwise.text.data_plan.DataConfig` for
    the data fields); a table without ``kind`` is this one."""

    #: a [task] table that names no kind is language modelling (headwise's first family: configs
    #: written before there were others name none)
    kind_optional: ClassVar[bool] = True
    kind: Literal["lm"] = "lm"
    #: tokens per training sequence (each block holds block_size + 1 tokens)
    block_size: int = Field(default=256, gt=0)
    #: evaluation batches (0: every validation block)
    eval_batches: int = Field(default=8, ge=0)
    eval_batch_size: int = Field(default=8, gt=0)

    def dims(self) -> Dims:
        """The tokenizer's ids (:meth:`~headwise.tasks.text.TextTaskConfig.tokenizer_vocab_size`);
        no vector inputs."""
        return Dims(self.tokenizer_vocab_size(), self.block_size)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return (f"language modelling on {Path(str(self.source)).name}, tokenizer {self.tokenizer}, "
                f"{facts.get('tokens_per_epoch', '?')} training tokens, sequences of {self.block_size}, "
                f"{facts.get('eval_tokens', '?')} eval tokens")

    def task_on(self, cache: TokenCache) -> LMTask:
        return LMTask(cache, block_size=self.block_size, eval_batches=self.eval_batches,
                      eval_batch_size=self.eval_batch_size)


LM_FAMILY = register_family(TaskFamily(kind="lm", config=LMTaskConfig, task=LMTask, report_layout="heads",
                                       generates_text=True, caches=(TokenCache,)))
