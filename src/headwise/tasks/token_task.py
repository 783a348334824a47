"""The base of the tasks that read a token cache in rows of ``block_size`` tokens (language
modelling, masked-LM pretraining): their held-out rows, epoch size and recorded facts. Their
``[task]`` base is :class:`~headwise.tasks.text.TextTaskConfig`; what differs is how a row is cut
and scored, which each family's task module says.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np

from headwise.data.shuffled import evenly_spaced
from headwise.errors import HeadwiseError
from headwise.tasks.base import Batch, Task
from headwise.text.packing import num_blocks
from headwise.text.token_cache import TokenCache
from headwise.text.tokenizer import Tokenizer


class TokenCacheTask(Task):
    """A task on a token cache's ids, in rows of ``block_size`` positions of which
    :attr:`specials` hold no text. Evaluation uses ``eval_batches`` batches of ``eval_batch_size``
    validation rows spread evenly over the validation tokens (fewer when the validation set is
    smaller; 0 means all of it), made once.

    A subclass checks its own arguments and sets what :meth:`_eval_batch` reads, then calls this
    ``__init__``; it gives the vocabulary, the training stream, the loss and its own facts."""

    inputs = "tokens"
    #: the ``[task] kind``, the first fact :meth:`describe` gives
    kind: ClassVar[str]
    #: positions of a row that hold no text (a masked LM's ``[CLS]`` and ``[SEP]``)
    specials: ClassVar[int] = 0
    #: what one row takes, in words, for the error on a split too short for one (the count is
    #: :attr:`stride` + 1)
    row_words: ClassVar[str]

    def __init__(self, cache: TokenCache, block_size: int, eval_batches: int, eval_batch_size: int) -> None:
        self.cache, self.block_size = cache, block_size
        for split, what in (("train", "training"), ("valid", "validation")):
            if num_blocks(cache.num_tokens(split), self.stride) == 0:
                raise HeadwiseError(
                    f"the {what} data of {cache.path} has {cache.num_tokens(split)} tokens, fewer than one "
                    f"{self.row_words} = {self.stride + 1}: lower block_size or add data"
                )
        self._eval = self._make_eval(eval_batches, eval_batch_size)

    @property
    def stride(self) -> int:
        """The text tokens one row takes from the cache (what :func:`~headwise.text.packing.num_blocks`
        counts rows in)."""
        return self.block_size - self.specials

    @property
    def seq_len(self) -> int:
        return self.block_size

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the cache was built with (what the run saves)."""
        return self.cache.tokenizer

    def _make_eval(self, eval_batches: int, eval_batch_size: int) -> list[Batch]:
        tokens = self.cache.tokens("valid")
        available = num_blocks(len(tokens), self.stride)
        # Evenly spaced rows cover the whole validation set, not just its first stories.
        blocks = evenly_spaced(available, None if eval_batches == 0 else eval_batches * eval_batch_size)
        return [self._eval_batch(tokens, blocks[i:i + eval_batch_size], i)
                for i in range(0, len(blocks), eval_batch_size)]

    @abstractmethod
    def _eval_batch(self, tokens: np.ndarray, blocks: np.ndarray, first: int) -> Batch:
        """The evaluation batch of the validation rows ``blocks`` (row indices of ``tokens``), the
        ``first`` of them at that position among all evaluation rows."""

    def eval_batches(self) -> list[Batch]:
        return list(self._eval)

    def tokens_per_epoch(self) -> int:
        return num_blocks(self.cache.num_tokens("train"), self.stride) * self.block_size

    def describe(self) -> dict[str, Any]:
        """The facts every task on a token cache records; a subclass adds its own after them."""
        meta = self.cache.meta
        return {
            "task": self.kind,
            "data": meta.get("description", ""),
            "cache": str(self.cache.path),
            "tokenizer": meta["tokenizer"]["spec"],
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
        }
