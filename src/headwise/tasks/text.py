"""The ``[task]`` base of the tasks on text (language modelling, masked-LM pretraining): tables
that tokenize text into a token cache (:class:`TextTaskConfig`). Both families' tables on the same
data reuse one token cache (:mod:`headwise.text.token_cache`); the tasks that read it in rows
share :class:`~headwise.tasks.token_task.TokenCacheTask`, imported when a table builds its task.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from headwise.tasks.family import TaskConfigBase
from headwise.text.data_plan import DataConfig, plan_data
from headwise.text.token_cache import TokenCache, prepare
from headwise.text.tokenizer import GPT_NEO_VOCAB, Tokenizer, parse_tokenizer_spec

if TYPE_CHECKING:
    from headwise.tasks.token_task import TokenCacheTask


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
