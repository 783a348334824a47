"""Language modelling on a token cache: packed blocks in, next-token cross-entropy out."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal

from pydantic import Field
from torch import Tensor

from headwise.data.shuffled import evenly_spaced
from headwise.errors import HeadwiseError
from headwise.model.loss import cross_entropy
from headwise.tasks.base import Batch, BatchStream, Task
from headwise.tasks.family import Dims, TaskConfigBase, TaskFamily, register_family
from headwise.text.data_plan import DataConfig, plan_data
from headwise.text.packing import PackedStream, gather_blocks, num_blocks
from headwise.text.token_cache import TokenCache, prepare
from headwise.text.tokenizer import GPT_NEO_VOCAB, Tokenizer, parse_tokenizer_spec


class LMTask(Task):
    """Next-token prediction: inputs and targets are int64 ``[B, block_size]`` token ids; the model
    returns logits ``[B, block_size, vocab]``.

    Evaluation uses ``eval_batches`` batches of ``eval_batch_size`` validation blocks spread evenly
    over the validation tokens (fewer when the validation set is smaller; 0 means all of it).
    """

    inputs = "tokens"
    outputs = "lm"

    def __init__(
        self, cache: TokenCache, block_size: int = 256, eval_batches: int = 8, eval_batch_size: int = 8
    ) -> None:
        if block_size < 1 or eval_batch_size < 1 or eval_batches < 0:
            raise HeadwiseError(
                f"block_size ({block_size}) and eval_batch_size ({eval_batch_size}) must be at least 1, "
                f"eval_batches ({eval_batches}) at least 0"
            )
        self.cache = cache
        self.block_size = block_size
        for split, what in (("train", "training"), ("valid", "validation")):
            if num_blocks(cache.num_tokens(split), block_size) == 0:
                raise HeadwiseError(
                    f"the {what} data of {cache.path} has {cache.num_tokens(split)} tokens, fewer than one "
                    f"block of block_size + 1 = {block_size + 1}: lower block_size or add data"
                )
        self._eval = self._make_eval(eval_batches, eval_batch_size)

    @property
    def vocab_size(self) -> int:
        return self.cache.vocab_size

    @property
    def seq_len(self) -> int:
        return self.block_size

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the cache was built with (what the run saves)."""
        return self.cache.tokenizer

    def train_stream(self, micro_batch: int, seed: int, rank: int = 0, world_size: int = 1) -> BatchStream:
        return PackedStream(self.cache.tokens("train"), self.block_size, micro_batch, seed, rank, world_size)

    def _make_eval(self, eval_batches: int, eval_batch_size: int) -> list[Batch]:
        tokens = self.cache.tokens("valid")
        available = num_blocks(len(tokens), self.block_size)
        # Evenly spaced blocks cover the whole validation set, not just its first stories.
        blocks = evenly_spaced(available, None if eval_batches == 0 else eval_batches * eval_batch_size)
        return [
            gather_blocks(tokens, blocks[i:i + eval_batch_size], self.block_size)
            for i in range(0, len(blocks), eval_batch_size)
        ]

    def eval_batches(self) -> list[Batch]:
        return list(self._eval)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of logits ``[B, T, V]`` against target ids ``[B, T]`` (in fp32), by
        :func:`headwise.model.loss.cross_entropy`: no fp32 copy of bf16 logits, no zero-filled
        gradient (the loss of [1024, 50,304] logits runs ~2.5x faster in bf16, ~1.5x in fp32).

        The logits may carry -inf columns past the vocabulary (the trainer asks the model for
        ``pad_vocab=True`` logits): they add nothing to the softmax, so the loss is the same."""
        return cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))

    def tokens_per_epoch(self) -> int:
        return num_blocks(self.cache.num_tokens("train"), self.block_size) * self.block_size

    def describe(self) -> dict[str, Any]:
        meta = self.cache.meta
        return {
            "task": "lm",
            "data": meta.get("description", ""),
            "cache": str(self.cache.path),
            "tokenizer": meta["tokenizer"]["spec"],
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "train_tokens": self.cache.num_tokens("train"),
            "valid_tokens": self.cache.num_tokens("valid"),
            "train_documents": meta["splits"]["train"]["documents"],
            "tokens_per_epoch": self.tokens_per_epoch(),
            "eval_tokens": sum(b.targets.numel() for b in self._eval),
        }


class TextTaskConfig(DataConfig, TaskConfigBase):
    """What every ``[task]`` on text shares (language modelling, masked-LM pretraining): the data
    fields of :class:`~headwise.text.data_plan.DataConfig`, tokenized once into the token
    cache, which tasks of either kind on the same data reuse."""

    def data_description(self) -> str:
        return f"{self.source} ({self.tokenizer})"

    def prepare(self, progress: bool = False) -> None:
        """Tokenize the data into the token cache (or check the cache already there)."""
        prepare(self, progress=progress)

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
        """``bpe:N`` has exactly N tokens (preparing data that cannot fill them is refused, so the
        shape known before the data exists is the one the cache gets), ``gpt-neo`` has its own;
        no vector inputs."""
        return Dims(parse_tokenizer_spec(self.tokenizer) or GPT_NEO_VOCAB, self.block_size)

    def setup_line(self, facts: dict[str, Any]) -> str:
        return (f"language modelling on {Path(str(self.source)).name}, tokenizer {self.tokenizer}, "
                f"{facts.get('tokens_per_epoch', '?')} training tokens, sequences of {self.block_size}, "
                f"{facts.get('eval_tokens', '?')} eval tokens")

    def build(self, cache_dir: str | Path | None = None, progress: bool = False,
              tokenizer: Tokenizer | None = None) -> LMTask:
        """The task on the token cache, which is prepared (or reused) first; ``tokenizer`` (a
        run's saved one) encodes the text instead of a BPE trained on it."""
        cache = prepare(self, cache_dir=cache_dir, progress=progress, tokenizer=tokenizer)
        return LMTask(cache, block_size=self.block_size, eval_batches=self.eval_batches,
                      eval_batch_size=self.eval_batch_size)


LM_FAMILY = register_family(TaskFamily(kind="lm", config=LMTaskConfig, task=LMTask, report_layout="heads",
                                       generates_text=True, caches=(TokenCache,)))
