"""Language modelling's ``[task]`` table (registers the family): text tokenized into the token
cache, next-token prediction in blocks of ``block_size``. Its task,
:class:`~headwise.families.lm.lm_task.LMTask`, is imported when the table builds it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from headwise.tasks.family import Dims, TaskFamily, register_family
from headwise.tasks.text import TextTaskConfig
from headwise.text.token_cache import TokenCache

if TYPE_CHECKING:
    from headwise.families.lm.lm_task import LMTask


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
        from headwise.families.lm.lm_task import LMTask

        return LMTask(cache, block_size=self.block_size, eval_batches=self.eval_batches,
                      eval_batch_size=self.eval_batch_size)


LM_FAMILY = register_family(TaskFamily(kind="lm", config=LMTaskConfig, inputs="tokens", outputs="lm",
                                       report_layout="heads", generates_text=True, caches=(TokenCache,)))
