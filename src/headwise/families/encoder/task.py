"""Masked-LM pretraining's ``[task]`` table (``kind = "mlm"``, registers the family): text
tokenized into the shared token cache (:mod:`headwise.tasks.text`, the same cache as language
modelling's on the same data), in ``[CLS] ... [SEP]`` rows of ``block_size``, a share of each
masked. Its task, :class:`~headwise.families.encoder.mlm_task.MLMTask`, is imported when the table
builds it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from headwise.tasks.family import Dims, TaskFamily, register_family
from headwise.tasks.text import TextTaskConfig
from headwise.text.masked_vocab import NUM_SPECIAL
from headwise.text.token_cache import TokenCache

if TYPE_CHECKING:
    from headwise.families.encoder.mlm_task import MLMTask


class MLMTaskConfig(TextTaskConfig):
    """``[task]`` of masked-LM pretraining on text (see :class:`~headwise.tasks.text.TextTaskConfig`
    for the data fields and token cache, those of every task on text)."""

    kind: Literal["mlm"] = "mlm"
    #: tokens per row, [CLS] and [SEP] included (cramming: 128)
    block_size: int = Field(default=128, gt=2)
    #: the fraction of each row's ordinary tokens masked (cramming: 0.25)
    mask_rate: float = 0.25
    #: evaluation batches (0: every validation row)
    eval_batches: int = Field(default=8, ge=0)
    eval_batch_size: int = Field(default=8, gt=0)

    @field_validator("mask_rate")
    @classmethod
    def _check_rate(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError(f"mask_rate {value} is outside (0, 1): use e.g. 0.15 (BERT) or 0.25 (cramming)")
        return value

    @model_validator(mode="after")
    def _masks_something(self) -> "MLMTaskConfig":
        if round(self.mask_rate * (self.block_size - 2)) < 1:
            raise ValueError(f"mask_rate {self.mask_rate} of block_size {self.block_size} (less [CLS] and [SEP]) "
                             "masks no token in a row: raise block_size or mask_rate")
        return self

    def dims(self) -> Dims:
        """The tokenizer's ids (:meth:`~headwise.tasks.text.TextTaskConfig.tokenizer_vocab_size`)
        plus the specials, less the end-of-text (which becomes ``[SEP]``)."""
        return Dims(self.tokenizer_vocab_size() + NUM_SPECIAL - 1, self.block_size)

    def spec_fields(self) -> dict[str, Any]:
        return {"causal": False}

    def reported_metrics(self) -> tuple[str, ...]:
        """``masked_accuracy``: the share of masked positions whose largest logit is the original id."""
        return ("masked_accuracy",)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return (f"masked-LM pretraining on {Path(str(self.source)).name}, tokenizer {self.tokenizer} + 4 specials, "
                f"rows of {self.block_size}, {self.mask_rate:.0%} masked (80/10/10), "
                f"{facts.get('tokens_per_epoch', '?')} training tokens")

    def task_on(self, cache: TokenCache) -> MLMTask:
        from headwise.families.encoder.mlm_task import MLMTask

        return MLMTask(cache, block_size=self.block_size, mask_rate=self.mask_rate,
                       eval_batches=self.eval_batches, eval_batch_size=self.eval_batch_size)


MLM_FAMILY = register_family(TaskFamily(kind="mlm", config=MLMTaskConfig, inputs="tokens", outputs="mlm",
                                        report_layout="heads"))
