"""What the tasks on text share (language modelling, masked-LM pretraining): the ``[task]`` base of
tables that tokenize text into a token cache (:class:`TextTaskConfig`), and the base of tasks that
read that cache in rows of ``block_size`` tokens (:class:`TokenCacheTask`).

Both families' tables on the same data reuse one token cache (:mod:`headwise.text.token_cache`);
what differs is how a row is cut and scored, which each family's task module says.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Iterator

import numpy as np

from headwise.data.shuffled import evenly_spaced
from headwise.errors import HeadwiseError
from headwise.tasks.base import Batch, Task
from headwise.tasks.family import TaskConfigBase
from headwise.text.data_plan import DataConfig, plan_data
from headwise.text.packing import num_blocks
from headwise.text.token_cache import TokenCache, prepare
from headwise.text.tokenizer import GPT_NEO_VOCAB, Tokenizer, parse_tokenizer_spec


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


class TextTaskConfig(DataConfig, TaskConfigBase):
    """What every ``[task]`` on text shares (language modelling, masked-LM pretraining): the data
    fields of :class:`~headwise.text.data_plan.DataConfig`, tokenized once into the token
    cache, which tasks of either kind on the same data reuse."""

    def tokenizer_vocab_size(self) -> int:
        """The ids the tokenizer gives, known before the data exists: ``bpe:N`` has exactly N
        (preparing data that cannot fill them is refused, so the cache gets this count),
        ``gpt-neo`` its own."""
        return parse_tokenizer_spec(self.tokenizer) or GPT_NEO_VOCAB

    def data_description(self) -> str:
        return f"{self.source} ({self.tokenizer})"

    def prepare(self, progress: bool = False) -> None:
        """Tokenize the data into the token cache (or check the cache already there)."""
        prepare(self, progress=progress)

    def build(self, cache_dir: str | Path | None = None, progress: bool = False,
              tokenizer: Tokenizer | None = None) -> TokenCacheTask:
        """The task on the token cache, which is prepared (or reused) first; ``tokenizer`` (a
        run's saved one) encodes the text instead of a BPE trained on it."""
        return self.task_on(prepare(self, cache_dir=cache_dir, progress=progress, tokenizer=tokenizer))

    @abstractmethod
    def task_on(self, cache: TokenCache) -> TokenCacheTask:
        """The task this table describes, on its prepared token cache."""

    def data_options(self) -> dict[str, Any]:
        """The data fields, which ``headwise data``'s options may override."""
        return self.data_fields()

    def held_out_texts(self) -> Iterator[str]:
        """The separate validation data, or the hold-out of the training source."""
        plan = plan_data(self)
        if plan.valid is not None:  # read only the validation data, never a (maybe huge) training source
            return plan.valid.documents()
        return (text for role, text in plan.documents() if role == "valid")

    def run_tokenizer(self, run_dir: Path) -> Tokenizer:
        """The tokenizer a run of this table trained with, as it saved it
        (:func:`headwise.run.tokenizer.read_run_tokenizer`): never trained again, unless an older
        headwise made the run and saved none."""
        from headwise.run.tokenizer import read_run_tokenizer

        return read_run_tokenizer(run_dir, self.tokenizer, lambda: prepare(self).tokenizer,
                                  f"training its {self.tokenizer} again on its data, which gives the ids it trained "
                                  "with only if that data is unchanged")
