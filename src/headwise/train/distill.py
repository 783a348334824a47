"""Distillation from a teacher run (``[train.distill]``): the student's loss mixed with the
Kullback-Leibler divergence of its next-token distributions from the teacher's, both softened by
a temperature (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"):

    loss = (1 - alpha) * task_loss + alpha * T**2 * KL(softmax(teacher / T) || softmax(student / T))

The T² keeps the soft targets' gradients on the task loss's scale as T grows. Minitron (Muralidharan
et al. 2024) heals pruned models this way, the unpruned model teaching. The teacher is loaded once,
checked before the run writes anything (a run, with the student's vocabulary and tokenizer), kept in
eval mode without gradients on the student's device, and called per micro-batch as the task calls the
student, under the same autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.errors import HeadwiseError, RunFailure
from headwise.parts import OUTPUT_HEAD_PARTS
from headwise.run.layout import RunDir
from headwise.tasks.base import Batch, Task
from headwise.train.config import DistillConfig

if TYPE_CHECKING:
    from headwise.model.transformer import Transformer
    from headwise.spec import ModelSpec
    from headwise.text.tokenizer import Tokenizer


def kl_at_temperature(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``KL(softmax(teacher / T) || softmax(student / T))`` per row of logits ``[..., V]``, averaged
    over the rows (the tokens), in float32."""
    s = F.log_softmax(student.float() / temperature, dim=-1)
    t = F.log_softmax(teacher.float() / temperature, dim=-1)
    return (t.exp() * (t - s)).sum(-1).mean()


def distill_loss(task_loss: Tensor, kl: Tensor, alpha: float, temperature: float) -> Tensor:
    """``(1 - alpha) * task_loss + alpha * temperature**2 * kl``."""
    return (1 - alpha) * task_loss + alpha * temperature ** 2 * kl


def _outputs_and_loss(task: Task, model: Callable[..., Tensor], batch: Batch) -> tuple[Tensor, Tensor]:
    """What ``model`` answers on ``batch`` as the task's :meth:`~headwise.tasks.base.Task.train_loss`
    calls it (a masked LM decodes its masked positions only), and that loss."""
    seen: list[Tensor] = []

    def forward(*args, **kwargs) -> Tensor:
        seen.append(model(*args, **kwargs))
        return seen[-1]

    loss = task.train_loss(forward, batch)
    return seen[-1], loss


@dataclass
class Distiller:
    """The teacher's model and the mix of ``[train.distill]`` on ``task``; the trainer calls its
    :meth:`train_loss` in place of the task's."""

    config: DistillConfig
    teacher: Transformer
    task: Task
    #: the real vocabulary: the logits' columns past it are -inf padding, whose KL terms are 0 x inf
    vocab_size: int

    def train_loss(self, student: Callable[..., Tensor], batch: Batch) -> Tensor:
        """The student's loss on ``batch``: its task loss mixed with its KL from the teacher."""
        outputs, task_loss = _outputs_and_loss(self.task, student, batch)
        with torch.no_grad():
            # called as the task calls the student, so both answer for the same positions
            targets, _ = _outputs_and_loss(self.task, self.teacher, batch)
        v, c = self.vocab_size, self.config
        kl = kl_at_temperature(outputs[..., :v], targets[..., :v], c.temperature)
        return distill_loss(task_loss, kl, c.alpha, c.temperature)


def load_distiller(config: DistillConfig, spec: ModelSpec, task: Task, tokenizer: Tokenizer | None,
                   device: torch.device) -> Distiller:
    """The teacher of ``config`` for a student of ``spec`` on ``task`` (encoding its text with
    ``tokenizer``), on ``device``. Raises HeadwiseError in one line when the task's outputs are no
    logits over a vocabulary, the teacher is not a run with a saved model, or its vocabulary is
    not the student's (another size, or another tokenizer); RunFailure for a damaged model file."""
    from headwise.model.pretrained import DamagedFile, load_pretrained, read_spec
    from headwise.train.generate import run_config

    where = f"train.distill.teacher = {config.teacher!r}"
    if not OUTPUT_HEAD_PARTS[task.outputs].vocabulary:
        raise HeadwiseError(f"[train.distill] matches next-token distributions, but this task's model answers "
                            f"{task.outputs!r} outputs, not logits over a vocabulary: remove [train.distill]")
    run = RunDir(Path(config.teacher))
    if not run.has_run():
        raise HeadwiseError(f"{where} is not a headwise run (no {run.config}): give the folder of a trained run")
    folder = run.model if config.teacher_checkpoint is None else run.checkpoints / config.teacher_checkpoint
    if not (folder / "spec.json").is_file():
        what = "has no final model" if config.teacher_checkpoint is None else \
            f"has no checkpoint {config.teacher_checkpoint!r}"
        raise HeadwiseError(f"{where} {what}: give a finished run, or name one of its checkpoints in "
                            "train.distill.teacher_checkpoint")
    try:
        theirs = read_spec(folder / "spec.json")
        head, vocab = getattr(theirs, "output_head", None), getattr(theirs, "vocab_size", None)
        if head != task.outputs or vocab != spec.vocab_size:
            raise HeadwiseError(f"{where} is a {head!r} model of vocab_size {vocab}, this run's a {task.outputs!r} "
                                f"model of vocab_size {spec.vocab_size}: a teacher must score the student's own "
                                "outputs and token ids")
        _check_same_tokenizer(run_config(run.path).task.run_tokenizer(run.path), tokenizer, where)
        teacher = load_pretrained(folder)
    except DamagedFile as exc:
        raise RunFailure(f"{exc}, so {where} cannot teach: restore the file from a copy of the run, or name "
                         "another of its checkpoints in train.distill.teacher_checkpoint") from None
    teacher.requires_grad_(False)
    return Distiller(config, teacher.to(device).eval(), task, spec.vocab_size)


def _check_same_tokenizer(theirs: Tokenizer | None, mine: Tokenizer | None, where: str) -> None:
    """Refuse a teacher whose tokenizer is not the student's: the same size is not the same vocabulary."""
    pair = (theirs, mine)
    if len({None if t is None else t.sha256 for t in pair}) > 1:
        said = [f"{t.spec} (sha256 {t.sha256[:12]})" if t is not None else "no tokenizer" for t in pair]
        raise HeadwiseError(f"{where} trained with {said[0]}, but this run's task encodes its text with {said[1]}: "
                            "the same size is not the same vocabulary; give a teacher trained with this run's "
                            "tokenizer (e.g. the run this one was pruned from)")
