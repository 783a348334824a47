"""GLUE fine-tuning (``[task] kind = "glue"``): a sentence (pair) classifier or regressor on a
masked-LM run's vocabulary, with cramming's first-token pooler as its output head.

The tasks themselves (inputs, targets, metrics over whole splits) are in
:mod:`headwise.families.encoder.glue_task`, imported when the table builds one; this module holds
the ``[task]`` table and the labelled examples it reads. The tasks'
output head is ``outputs = "cls_pooler"``, cramming's GLUE pooler
(:class:`headwise.families.encoder.model.ClsPoolerHead`; one output for STS-B's regression).

Each task is scored on its validation split; MNLI on ``validation_matched`` (``accuracy``) and
``validation_mismatched`` (``accuracy_mismatched``) at once, as cramming scores it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.families.encoder.glue import TASKS, Examples, read_glue
from headwise.families.encoder.standin import STANDIN_METRICS, order_splits, standin_splits
from headwise.run.layout import RunDir
from headwise.tasks.family import Dims, TaskConfigBase, TaskFamily, register_family
from headwise.text.masked_vocab import PAD_ID, MaskedVocab
from headwise.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from headwise.families.encoder.glue_task import GlueFinetuneTask

#: the offline stand-ins (headwise.families.encoder.standin) by task name
STANDINS = {"standin": standin_splits, "standin_order": order_splits}
#: the splits each GLUE task is scored on, by metric suffix (the first is named plainly)
EVAL_SPLITS = {"mnli": {"": "validation_matched", "mismatched": "validation_mismatched"}}


def pretraining_task(run: str | Path):
    """The ``[task]`` table of masked-LM run ``run`` (refused in one line when it is not one)."""
    from headwise.families.encoder.task import MLMTaskConfig

    run_dir = RunDir(Path(run))
    if not run_dir.has_run():
        raise HeadwiseError(f"tokenizer_from = {str(run)!r} is not a headwise run (no {run_dir.config}): "
                            "give the folder of a masked-LM pretraining run")
    table = read_toml(run_dir.config).get("task", {})
    if table.get("kind") != "mlm":
        raise HeadwiseError(f"tokenizer_from = {str(run)!r} is a {table.get('kind')!r} run, not a masked-LM "
                            "(kind = \"mlm\") run: give the pretraining run whose vocabulary the encoder knows")
    return MLMTaskConfig.parse(table, source=str(run_dir.config))


def pretraining_tokenizer(run: str | Path) -> Tokenizer:
    """The tokenizer masked-LM run ``run`` saved (:mod:`headwise.run.tokenizer`), never a BPE trained
    again on its text, which may have changed since."""
    return pretraining_task(run).run_tokenizer(Path(run))


class GlueTaskConfig(TaskConfigBase):
    """``[task]`` of GLUE fine-tuning: the task, where its data is, and the pretraining run whose
    vocabulary the inputs are encoded in."""

    kind: Literal["glue"] = "glue"
    task: Literal["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "standin", "standin_order"]
    #: GLUE: a folder in nyu-mll/glue's layout or a hub name; standin: a TinyStories text file
    source: str = "tinystories-valid-sample.txt"
    #: the masked-LM run whose vocabulary (tokenizer + [PAD] [CLS] [SEP] [MASK]) encodes the inputs
    tokenizer_from: str
    max_length: int = Field(default=128, gt=3)
    eval_batch_size: int = Field(default=32, gt=0)
    #: standin: the seed of its construction and the share of passages held out for evaluation
    standin_seed: int = 0
    standin_eval_frac: float = Field(default=0.2, gt=0, lt=1)

    #: the inputs are encoded in a masked-LM run's vocabulary ([PAD] [CLS] [SEP] [MASK] included)
    vocabulary_kinds: ClassVar[tuple[str, ...] | None] = ("mlm",)

    def vocabulary_run(self) -> str:
        return self.tokenizer_from

    def reported_metrics(self) -> tuple[str, ...]:
        """The task's metrics on each evaluation split, a later split's with its suffix (MNLI's
        ``accuracy`` and ``accuracy_mismatched``), as :class:`GlueFinetuneTask` names them."""
        metrics = STANDIN_METRICS if self.task in STANDINS else TASKS[self.task].metrics
        splits = EVAL_SPLITS.get(self.task, {"": "validation"})
        return tuple(name + (f"_{suffix}" if suffix else "") for suffix in splits for name in metrics)

    def num_classes(self) -> int:
        return 2 if self.task in STANDINS else TASKS[self.task].num_labels

    def dims(self) -> Dims:
        return Dims(pretraining_task(self.tokenizer_from).dims().vocab_size, self.max_length)

    def spec_fields(self) -> dict[str, Any]:
        return {"causal": False, "num_classes": self.num_classes(), "pad_id": PAD_ID}

    def data_description(self) -> str:
        return f"{self.task} from {self.source}"

    def prepare(self, progress: bool = False) -> None:
        """Read the task's splits (from the hub, its cache or a folder; the stand-in built), so that a
        study finds a missing or broken source before any run; the encoding needs the pretraining run."""
        self.splits()

    def splits(self) -> tuple[Examples, dict[str, Examples], str]:
        """The training examples, the evaluation splits by metric suffix, and where they came from."""
        if self.task in STANDINS:
            train, evaluation = STANDINS[self.task](self.source, self.standin_seed, self.standin_eval_frac)
            return Examples(*train), {"": Examples(*evaluation)}, f"stand-in from {self.source}"
        train = read_glue(self.task, self.source, "train")
        splits = {suffix: read_glue(self.task, self.source, split)
                  for suffix, split in EVAL_SPLITS.get(self.task, {"": "validation"}).items()}
        return (Examples(train.texts, train.labels), {k: Examples(v.texts, v.labels) for k, v in splits.items()},
                "; ".join([train.origin, *(v.origin for v in splits.values())]))

    def run_tokenizer(self, run_dir: Path) -> Tokenizer:
        """The tokenizer a fine-tuning run saved (its pretraining run's, as it was when it started);
        a run an older headwise made, which saved none, reads its ``tokenizer_from`` run's."""
        from headwise.run.tokenizer import read_run_tokenizer

        return read_run_tokenizer(run_dir, None, lambda: pretraining_tokenizer(self.tokenizer_from),
                                  f"reading its tokenizer_from run {self.tokenizer_from}'s, which gives the ids it "
                                  "fine-tuned with only if that run is unchanged")

    def build(self, cache_dir: str | Path | None = None, progress: bool = False,
              tokenizer: Tokenizer | None = None) -> GlueFinetuneTask:
        """Read the splits and encode them in the pretraining run's vocabulary: the tokenizer it
        saved, or ``tokenizer`` (a fine-tuning run's own saved one) when given."""
        from headwise.families.encoder.glue_task import GlueFinetuneTask, GlueRegressionTask

        vocab = MaskedVocab(tokenizer if tokenizer is not None else pretraining_tokenizer(self.tokenizer_from))
        train, evaluation, origin = self.splits()
        if self.task in STANDINS:
            return GlueFinetuneTask(self.task, vocab, train, evaluation, 2, STANDIN_METRICS, self.max_length,
                                    self.eval_batch_size, origin=origin)
        spec = TASKS[self.task]
        task = GlueRegressionTask if spec.regression else GlueFinetuneTask
        return task(self.task, vocab, train, evaluation, spec.num_labels, spec.metrics, self.max_length,
                    self.eval_batch_size, origin=origin)


GLUE_FAMILY = register_family(TaskFamily(kind="glue", config=GlueTaskConfig, inputs="tokens",
                                         outputs="cls_pooler", report_layout="heads"))
