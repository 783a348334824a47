"""Fine-tuning from a pretrained run: ``[train] init_from`` (and ``init_checkpoint``).

The new run's model is built from its own config; its encoder (every module but the output
head) must have exactly the shape of the source run's saved spec, and takes the source's
weights; the output head (e.g. a classifier instead of the masked-LM decoder) starts fresh.
Everything is checked before the run writes anything; a resumed run restores its own
checkpoint and never reads the source again. The model code (torch) is imported by the functions
that read the source, so that a study reads :data:`HEAD_FIELDS` without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from headwise.errors import HeadwiseError, RunFailure
from headwise.parts import OUTPUT_HEAD_PARTS
from headwise.run.layout import RunDir
from headwise.spec import ModelSpec

if TYPE_CHECKING:
    from headwise.model.transformer import Transformer
    from headwise.text.tokenizer import Tokenizer
    from headwise.train.config import RunConfig

T = TypeVar("T")

#: spec fields that do not shape the encoder's weights: the output head's, padding and dropout
HEAD_FIELDS = frozenset({"outputs", "num_classes", "pooling", "classifier_hidden", "pad_id", "dropout", "drop_path"})


@dataclass(frozen=True)
class InitSource:
    """Where a fine-tuning run's encoder weights come from."""

    run: Path
    #: the model folder read: the run's final ``model/`` or one of its checkpoints
    model_dir: Path
    checkpoint: str | None


def check_init_source(init_from: str, checkpoint: str | None, spec: ModelSpec,
                      vocabulary_run: str | None = None, tokenizer: "Tokenizer | None" = None) -> InitSource:
    """The source of ``[train] init_from`` for a model of ``spec``, checked: a headwise run with a
    saved model (or the named checkpoint) whose encoder has the same shape, which trained with
    ``tokenizer`` (the one the task encodes its text with: the hashes must be equal, the same size is
    not the same vocabulary), and which is the run whose vocabulary the task reads (``vocabulary_run``,
    when the task names one). Raises HeadwiseError in one line naming the first difference otherwise,
    and RunFailure naming a damaged file of the source's model (its files are verified here)."""
    from headwise.model.pretrained import read_spec, verify_model_dir

    run = RunDir(Path(init_from))
    if not run.has_run():
        raise HeadwiseError(f"train.init_from = {init_from!r} is not a headwise run (no {run.config}): give the "
                            "folder of a finished pretraining run")
    model_dir = run.model if checkpoint is None else run.checkpoints / checkpoint
    if not (model_dir / "spec.json").is_file():
        what = "has no final model (did it finish?)" if checkpoint is None else f"has no checkpoint {checkpoint!r}"
        raise HeadwiseError(f"train.init_from run {init_from} {what}: give a finished run or name one of its "
                            f"checkpoints in train.init_checkpoint")
    source = _checked(lambda: read_spec(model_dir / "spec.json"), init_from, checkpoint)
    if not OUTPUT_HEAD_PARTS[source.output_head].token_encoder or source.vocab_size is None:
        raise HeadwiseError(f"train.init_from run {init_from} is a {source.output_head!r} model without a token "
                            "encoder to fine-tune: give a masked-LM (outputs \"mlm\") pretraining run")
    mine, theirs = spec.model_dump(), source.model_dump()
    for key in mine:
        if key not in HEAD_FIELDS and mine[key] != theirs.get(key):
            raise HeadwiseError(f"train.init_from run {init_from} has {key} = {theirs.get(key)!r} but this run's "
                                f"model has {mine[key]!r}: fine-tune the same encoder (set model.{key} to match)")
    if tokenizer is not None:
        _check_same_tokenizer(run.path, tokenizer, vocabulary_run)
    if vocabulary_run is not None and Path(vocabulary_run).resolve() != run.path.resolve():
        # embeddings belong to their own run's tokenizer: a copy of it is still another run to keep in step
        raise HeadwiseError(f"train.init_from = {init_from!r} but the task's tokenizer_from = {vocabulary_run!r}: "
                            "the encoder's embeddings belong to its own run's vocabulary; name the same run in both")
    # last, as it reads every byte: a cut or altered weights file is found before the run writes
    # anything, not when the weights are loaded
    _checked(lambda: verify_model_dir(model_dir), init_from, checkpoint)
    return InitSource(run.path, model_dir, checkpoint)


def _checked(read: Callable[[], T], init_from: str, checkpoint: str | None) -> T:
    """``read()`` of the source's model folder, a damaged file in it a RunFailure naming it."""
    from headwise.model.pretrained import DamagedFile

    try:
        return read()
    except DamagedFile as exc:
        other = "another of its checkpoints" if checkpoint is not None else "one of its checkpoints"
        raise RunFailure(f"{exc}, so train.init_from run {init_from} cannot be fine-tuned from: restore the file "
                         f"from a copy of the run, or name {other} in train.init_checkpoint") from None


def _check_same_tokenizer(source: Path, tokenizer: "Tokenizer", vocabulary_run: str | None) -> None:
    """Refuse a source run whose saved tokenizer is not ``tokenizer``: its embedding rows would be
    read for ids that mean other text."""
    from headwise.train.generate import run_config, run_tokenizer

    theirs = run_tokenizer(source, run_config(source))
    if theirs.sha256 != tokenizer.sha256:
        where, fix = (
            (f"tokenizer_from run {vocabulary_run}'s", "name the init_from run in task.tokenizer_from too")
            if vocabulary_run else
            ("the one learnt on this run's text", "train on the text and tokenizer the init_from run learnt its BPE on"))
        raise HeadwiseError(
            f"train.init_from run {source} trained with tokenizer {theirs.spec} (sha256 {theirs.sha256[:12]}), but this "
            f"run's task encodes its text with {where}, {tokenizer.spec} (sha256 {tokenizer.sha256[:12]}): the same size "
            f"is not the same vocabulary, and the encoder's embeddings belong to its own ids; {fix}")


def converted_tokenizer(cfg: RunConfig, out: Path, resume: bool) -> Tokenizer | None:
    """The tokenizer of a run whose task names a converted model's own (``hf:N``), which no run can
    learn, only read: the run's own saved one when it resumes, else its ``train.init_from`` run's (a
    converted or pruned model fine-tuned on new text). None for any other tokenizer, and for a new
    run without ``init_from`` (preparing its data refuses that, saying why)."""
    spec = getattr(cfg.task, "tokenizer", None)
    if not (isinstance(spec, str) and spec.startswith("hf:")):
        return None
    source = out if resume and RunDir(out).config.is_file() else cfg.train.init_from
    if source is None:
        return None
    from headwise.train.generate import run_config, run_tokenizer

    tokenizer = run_tokenizer(Path(source), run_config(Path(source)))
    if tokenizer.spec != spec:
        raise HeadwiseError(f"task.tokenizer = {spec!r}, but the run {source} saved the tokenizer {tokenizer.spec}: "
                            f"set task.tokenizer = {tokenizer.spec!r}")
    return tokenizer


def load_encoder(model: Transformer, source: InitSource) -> None:
    """Copy the source model's weights into ``model``, all but the output heads' modules: every
    encoder tensor must be there with its shape, the new head keeps its fresh initialisation."""
    from headwise.model.pretrained import load_pretrained

    pretrained = load_pretrained(source.model_dir, verify=False)  # check_init_source verified the files
    theirs = {name for name, _ in pretrained.named_children()}
    mine = {name for name, _ in model.named_children()}
    # the source's head (lm_head) is not in this model; this model's head (pooler, classifier) not in the source
    state = {k: v for k, v in pretrained.state_dict().items() if k.split(".")[0] in mine}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k.split(".")[0] in theirs]
    if missing or unexpected:
        raise HeadwiseError(f"the encoder of {source.model_dir} does not fit this model "
                            f"({'missing ' + missing[0] if missing else 'unexpected ' + unexpected[0]})")
