"""``RunConfig``: one training run as TOML tables, and its resolution against a task.

Tables: ``[model]`` (an optional ``preset`` plus any :class:`~headwise.spec.ModelSpec` field,
and an optional ``[model.plan]`` that sets ``heads``), ``[task]``, ``[optim]``, ``[schedule]``,
``[train]`` (with optional ``[train.distill]`` and ``[train.prune]``), ``[eval]``, ``[checkpoint]``, ``[analysis]``,
``[log]`` (the trackers' own :class:`~headwise.train.trackers.LogConfig`). What depends on the
task (the vocabulary, the number of steps, gradient accumulation) is settled by
:func:`resolve_spec` and :func:`batch_layout`; :func:`resolved_config` gives the config that
reproduces a run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import Field, create_model, field_validator, model_validator

from headwise.budget import parse_budget
from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.model_sources import MODEL_SOURCES, source_table
from headwise.plans import Plan, Scheme, plan_heads, plan_kv_heads
from headwise.presets import preset_dict
from headwise.spec import ModelSpec, front_ends
from headwise.tasks.base import Task, TaskShape
from headwise.tasks.union import TaskConfig
from headwise.train.trackers import LogConfig


class PlanConfig(Config):
    """``[model.plan]``: what is asked of the head plan (see :func:`headwise.plans.plan_heads`); the
    resolved :class:`~headwise.plans.Plan` is what came out of it."""

    scheme: Scheme
    total_heads: int | None = Field(default=None, gt=0)
    ratio: float = Field(default=2.0, gt=0)
    heads: list[int] | None = None
    #: ``layerwise`` only (:func:`headwise.plans.layerwise_scaling`; None: OpenELM's defaults): the
    #: first and last layers' multipliers, query heads per KV head, the FFN width's divisor
    qkv_multipliers: tuple[float, float] | None = None
    ffn_multipliers: tuple[float, float] | None = None
    gqa_groups: int | None = Field(default=None, gt=0)
    ffn_divisor: int | None = Field(default=None, gt=0)
    #: key/value heads over the query plan (:func:`headwise.plans.plan_kv_heads`): query heads per
    #: KV head in every layer, or a scheme with a budget of KV heads (``kv_ratio``: as ``ratio``)
    kv_group: int | None = Field(default=None, gt=0)
    kv_scheme: Scheme | None = None
    kv_total_heads: int | None = Field(default=None, gt=0)
    kv_ratio: float | None = Field(default=None, gt=0)  # None: 2, as ratio (and left out of saved configs)


# ``[model]`` accepts every ModelSpec field, each optional (a preset or the spec's default fills
# it); the spec itself validates the merged values. Built from ModelSpec so the two never drift.
ModelConfig = create_model(
    "ModelConfig",
    __base__=Config,
    __doc__="``[model]``: an optional preset, any ModelSpec field overriding it, an optional plan.",
    preset=(Optional[str], None),
    plan=(Optional[PlanConfig], None),
    # a model another library builds (headwise.model_sources): its own table, read by its source
    timm=(Optional[dict[str, Any]], None),
    **{name: (Optional[field.annotation], None) for name, field in ModelSpec.model_fields.items()},
)


class OptimConfig(Config):
    """``[optim]``: AdamW. Weight decay applies to matrices only (see :func:`headwise.train.optim.build_optimizer`)."""

    lr: float = Field(default=3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(default=0.1, ge=0)
    eps: float = Field(default=1e-8, gt=0)


class ScheduleConfig(Config):
    """``[schedule]``: linear warm-up (steps or a fraction of the run), then cosine (or linear)
    decay to ``min_lr`` at the last step (see :func:`headwise.train.optim.lr_at`).

    The defaults are the warm-up + cosine schedule every saved config before these options was
    trained with. ``warmup_start_lr``, ``decay = "linear"`` and ``cycle_beta1`` together are
    torch's ``OneCycleLR(anneal_strategy="linear")``, the Nystromformer LRA code's schedule."""

    warmup_steps: int | None = Field(default=None, ge=0)
    warmup_frac: float | None = Field(default=None, ge=0, le=1)
    #: None: a tenth of ``optim.lr`` (nanoGPT's and Chinchilla's choice); resolved in the saved config.
    min_lr: float | None = Field(default=None, ge=0)
    decay: Literal["cosine", "linear"] = "cosine"
    #: None: the warm-up climbs from 0, step s at lr (s + 1) / warmup, and the decay starts the step
    #: after it; a value: the first step's learning rate, climbing linearly to lr at the warm-up's
    #: last step, where the decay starts (OneCycleLR's phases; it starts at lr / 25)
    warmup_start_lr: float | None = Field(default=None, ge=0)
    #: (low, high): AdamW's beta1 moves against the learning rate, from high at the first step to low
    #: at the peak and back to high at the last step, as OneCycleLR cycles it by default (0.85,
    #: 0.95); None: ``optim.betas[0]`` throughout
    cycle_beta1: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _one_warmup(self) -> "ScheduleConfig":
        if self.warmup_steps is not None and self.warmup_frac is not None:
            raise ValueError("give warmup_steps or warmup_frac, not both")
        if self.warmup_start_lr is not None and not (self.warmup_steps or self.warmup_frac):
            raise ValueError("warmup_start_lr is where a warm-up starts: give warmup_steps or warmup_frac too, "
                             "or remove it")
        if self.cycle_beta1 is not None:
            low, high = self.cycle_beta1
            if not 0 <= low <= high < 1:
                raise ValueError(f"cycle_beta1 = [{low}, {high}]: give [low, high] with 0 <= low <= high < 1, "
                                 "e.g. OneCycleLR's [0.85, 0.95]")
        return self


class DistillConfig(Config):
    """``[train.distill]``: distillation from a teacher run (:mod:`headwise.train.distill`), e.g. the
    unpruned model healing its pruned copy. Each micro-batch's loss is ``(1 - alpha) * task_loss +
    alpha * temperature**2 * KL(teacher || student)`` over the next-token distributions at the
    temperature (Hinton et al. 2015); the logged ``train_loss`` is that mix, ``eval_loss`` the task's."""

    #: the teacher's run folder: its final model, or ``teacher_checkpoint`` (a folder name in its checkpoints/)
    teacher: str
    teacher_checkpoint: str | None = None
    temperature: float = Field(default=2.0, gt=0)
    alpha: float = Field(default=0.5, ge=0, le=1)

    @field_validator("teacher")
    @classmethod
    def _absolute(cls, run: str) -> str:
        return os.path.abspath(run)  # as train.init_from: resume and export read it from anywhere


class PruneConfig(Config):
    """``[train.prune]``: the ``train.init_from`` model's lowest-scoring heads removed to a budget
    before the run trains it (:mod:`headwise.train.prune_init`), scored on the run's own training
    batches; ``[model]`` is then the init_from model's, and the run trains the smaller one."""

    #: the cap, as ``headwise heads prune --to`` takes it: heads:N, params:N, flops:N, kv-bytes:N
    to: str
    scope: Literal["global", "per-layer"] = "global"
    method: Literal["gradient", "activation", "ablation"] = "gradient"
    #: training tokens the heads are scored on (sequences of the task's block size)
    tokens: int = Field(default=8192, gt=0)

    @field_validator("to")
    @classmethod
    def _budget(cls, to: str) -> str:
        try:
            parse_budget(to)
        except HeadwiseError as exc:
            raise ValueError(str(exc).replace("--to", "to =", 1)) from None
        return to


class TrainConfig(Config):
    """``[train]``: batch, duration, precision, device and logging."""

    micro_batch: int = Field(default=8, gt=0)
    #: micro-batches per optimiser step on each process; or give tokens_per_step instead.
    grad_accum: int | None = Field(default=None, gt=0)
    tokens_per_step: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)
    epochs: float | None = Field(default=None, gt=0)
    tokens: int | None = Field(default=None, gt=0)
    #: maximum global gradient norm; 0 turns clipping off.
    grad_clip: float = Field(default=1.0, ge=0)
    precision: Literal["fp32", "bf16"] = "fp32"
    compile: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    log_every: int = Field(default=10, gt=0)
    #: peak FLOP/s of one device for the MFU estimate; None: a per-device default (see metrics.py).
    peak_flops: float | None = Field(default=None, gt=0)
    #: fine-tuning: the run whose final model (or ``init_checkpoint``, a folder name in its
    #: checkpoints/) gives the encoder's weights; the output head starts fresh. A training
    #: setting, not a [model] one: the model is still built from [model] (see headwise.train.init_from).
    init_from: str | None = None
    init_checkpoint: str | None = None
    distill: DistillConfig | None = None
    prune: PruneConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        given = [k for k in ("steps", "epochs", "tokens") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of steps, epochs or tokens for the run's length"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.grad_accum is not None and self.tokens_per_step is not None:
            raise ValueError("give grad_accum or tokens_per_step, not both")
        if self.init_checkpoint is not None and self.init_from is None:
            raise ValueError("init_checkpoint names a checkpoint of the init_from run: set init_from too")
        if self.prune is not None and self.init_from is None:
            raise ValueError("[train.prune] prunes the init_from run's model: set train.init_from too")
        return self

    @field_validator("init_from")
    @classmethod
    def _absolute(cls, run: str | None) -> str | None:
        # a path relative to where the run was started names another folder (or none) from
        # anywhere else: the saved config must name its source for export, generate and resume
        return os.path.abspath(run) if run else run


class EvalConfig(Config):
    """``[eval]``: evaluate on the task's fixed held-out batches every N steps (0: never) and at the end."""

    every: int = Field(default=0, ge=0)
    at_end: bool = True


class CheckpointConfig(Config):
    """``[checkpoint]``: save every N steps (0: only at the end and on a signal), keeping the last K."""

    every: int = Field(default=0, ge=0)
    keep: int = Field(default=2, ge=1)
    at_end: bool = True


class AnalysisConfig(Config):
    """``[analysis]``: log the model's attention analysis (``spec.analyze(model, [batch]).metrics()``)
    every N steps (0: off)."""

    every: int = Field(default=0, ge=0)


class RunConfig(Config):
    """Everything one training run needs; ``RunConfig.load(path, overrides)`` reads a TOML file."""

    model: ModelConfig  # type: ignore[valid-type]
    task: TaskConfig
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        start = self.schedule.warmup_start_lr
        if start is not None and start > self.optim.lr:
            raise ValueError(f"schedule.warmup_start_lr {start:g} is above optim.lr {self.optim.lr:g}, the peak its "
                             "warm-up climbs to: give a start at or below the peak (OneCycleLR starts at lr / 25)")
        # the run whose vocabulary the task reads is named by path too: kept absolute, as init_from
        # (the task's field that holds it is the one whose value vocabulary_run returns)
        run = self.task.vocabulary_run()
        if run and not os.path.isabs(run):
            for name in type(self.task).model_fields:
                if getattr(self.task, name) == run:
                    setattr(self.task, name, os.path.abspath(run))
        return self


def resolve_spec(model: Any, task: TaskShape | Task, source: str = "config") -> tuple[ModelSpec, Plan]:
    """The ModelSpec of ``[model]`` for a task (its :class:`~headwise.tasks.base.TaskShape`, or the
    task itself), and its head plan.

    A preset gives the starting fields and the table's own fields override them. The task sets
    the model's front end and output head, and supplies ``vocab_size`` when the table does not set
    it (so a preset's vocabulary never silently mismatches a trained tokenizer); a vector model's
    width must be the data's, and the other fields the data dictates (an image's size and
    channels, the class count) are the data's, refused when the table says otherwise. Without ``[model.plan]`` the plan is the explicit one of the spec's
    heads; with it, ``heads`` may be given too (a resolved config records both) but must be what
    the plan gives.
    """
    shape = task.shape() if isinstance(task, Task) else task
    given = {k: getattr(model, k) for k in model.model_fields_set if k not in ("preset", "plan")}
    fields: dict[str, Any] = preset_dict(model.preset) if model.preset else {}
    where = f"{source} [model]"
    table = source_table({**fields, **given})
    if table is not None:
        return _resolve_source(table, model, fields, given, shape, where)
    fields.update(given)
    for key in ("inputs", "outputs"):
        wanted = getattr(shape, key)
        if given.get(key) is not None and given[key] != wanted:
            raise HeadwiseError(f"{where}: {key} = {given[key]!r}, but this task takes {wanted!r} {key}: remove {key}")
    fields["inputs"] = shape.inputs
    # the spec's default head for these inputs is left implicit, so saved specs stay as they were
    fields.pop("outputs", None)
    if shape.outputs != front_ends()[shape.inputs].default_outputs:
        fields["outputs"] = shape.outputs
    _set_vocab(fields, given.get("vocab_size"), shape.vocab_size, where)
    for key, value in shape.spec_fields.items():
        if given.get(key) is not None and given[key] != value:
            raise HeadwiseError(f"{where}: {key} = {given[key]!r}, but the task's data has {value!r}: remove {key}")
        fields[key] = value
    plan = None
    if model.plan is not None:
        plan = _plan_of(model.plan, fields, where)
        if given.get("heads") is not None and list(given["heads"]) != list(plan.heads):
            raise HeadwiseError(
                f"{where}: heads {given['heads']} differ from the {plan.scheme} plan's {list(plan.heads)}; "
                "give heads or [model.plan], or heads equal to what the plan gives"
            )
        fields["heads"] = list(plan.heads)
        for key in ("kv_heads", "mlp_hidden"):  # set by the layerwise scheme, kv_heads by a key/value plan too
            value = list(getattr(plan, key))
            if value:
                # a saved run config keeps them beside the plan: equal values are the plan's own
                if given.get(key) is not None and given[key] != value:
                    raise HeadwiseError(f"{where}: {key} {given[key]} differ from the {plan.scheme} plan's {value}; "
                                        f"give {key} or [model.plan], or {key} equal to what the plan gives")
                fields[key] = value
    spec = ModelSpec.parse(fields, source=where)
    # the positions the blocks see: the task's sequences, with a class token if the model has one
    positions = front_ends()[spec.inputs].positions(spec, shape.seq_len)
    if spec.max_seq_len < positions:
        extra = " positions with the class token" if positions != shape.seq_len else ""
        raise HeadwiseError(
            f"{where}: max_seq_len {spec.max_seq_len} is shorter than the task's sequences ({positions}{extra}); "
            f"set model.max_seq_len >= {positions}"
        )
    if shape.input_dim is not None and spec.d_model != shape.input_dim:
        raise HeadwiseError(
            f"{where}: d_model {spec.d_model} differs from the task's vector size {shape.input_dim}: "
            "a vector model's width is the data's dimension"
        )
    plan = Plan.explicit(spec.heads) if plan is None else plan
    return spec, plan.with_head_dims(spec.head_dims)


def _resolve_source(table: str, model: Any, preset: dict[str, Any], given: dict[str, Any], shape: TaskShape,
                    where: str) -> tuple[Any, Plan]:
    """The spec of a model another library builds (``[model.<table>]``, over a preset's table),
    refusing ModelSpec's fields and a head plan, which it does not read."""
    others = sorted((set(preset) | set(given)) - {table})
    if others or model.plan is not None:
        name = others[0] if others else "plan"
        raise HeadwiseError(f"{where}: {name} does not apply to a model of [model.{table}]: set what its table "
                            f"takes there, or remove {name}")
    fields = {**preset.get(table, {}), **(given.get(table) or {})}
    return MODEL_SOURCES[table].resolve(fields, shape, where)


def resolve_run_model(cfg: dict[str, Any], source: str = "run config") -> tuple[ModelSpec, Plan]:
    """Check a run config dict as ``headwise train`` would before it starts (the tables, the model
    the preset and plan resolve to against the task) and return the model's spec and head plan.
    The task is judged from its config alone: no data is prepared."""
    run = RunConfig.parse(cfg, source=source)
    return resolve_spec(run.model, run.task.shape(), source=source)


def _set_vocab(fields: dict[str, Any], given: int | None, task_vocab: int | None, where: str) -> None:
    """The model's vocabulary: the task's, unless the table asks for a larger one; none when the
    task's inputs have no vocabulary."""
    if task_vocab is None:
        if given is not None:
            raise HeadwiseError(f"{where}: this task's inputs have no vocabulary: remove vocab_size")
        fields["vocab_size"] = None
    elif given is None:
        fields["vocab_size"] = task_vocab
    elif given < task_vocab:
        raise HeadwiseError(
            f"{where}: vocab_size {given} is smaller than the tokenizer's {task_vocab} tokens; "
            "omit vocab_size to use the tokenizer's"
        )


def _plan_of(asked: PlanConfig, fields: dict[str, Any], where: str) -> Plan:
    """The plan ``[model.plan]`` asks for, for the model's depth and width."""
    for key in ("n_layers", "d_model"):
        if key not in fields:
            raise HeadwiseError(f"{where}: [model.plan] needs {key} (set it or choose a preset)")
    head_dim = fields.get("head_dim")
    layerwise = {key: getattr(asked, key) for key in ("qkv_multipliers", "ffn_multipliers", "gqa_groups",
                                                      "ffn_divisor") if getattr(asked, key) is not None}
    if layerwise and asked.scheme is not Scheme.LAYERWISE:
        raise HeadwiseError(f"{where}: [model.plan] {next(iter(layerwise))} applies only to scheme 'layerwise'")
    kv_asked = asked.kv_group is not None or asked.kv_scheme is not None
    if asked.kv_total_heads is not None and asked.kv_scheme is None:
        raise HeadwiseError(f"{where}: [model.plan] kv_total_heads needs kv_scheme (e.g. kv_scheme = \"constant\")")
    if kv_asked and asked.scheme is Scheme.LAYERWISE:
        raise HeadwiseError(f"{where}: [model.plan] scheme 'layerwise' sets the key/value heads itself (gqa_groups): "
                            "remove kv_group / kv_scheme")
    if asked.kv_group is not None and (asked.kv_scheme is not None or asked.kv_total_heads is not None):
        raise HeadwiseError(f"{where}: [model.plan] give kv_group, or kv_scheme with kv_total_heads, not both")
    plan = plan_heads(asked.scheme, fields["n_layers"], fields["d_model"], asked.total_heads, ratio=asked.ratio,
                      heads=asked.heads, head_dim=head_dim if isinstance(head_dim, int) else None,
                      layerwise=layerwise)
    if not kv_asked:
        return plan
    try:
        kv, notes = plan_kv_heads(plan.heads, group=asked.kv_group, scheme=asked.kv_scheme,
                                  total=asked.kv_total_heads, ratio=asked.kv_ratio or 2.0)
    except HeadwiseError as e:
        raise HeadwiseError(f"{where}: [model.plan] {e}") from None
    return plan.with_kv_heads(kv, notes)


@dataclass(frozen=True)
class BatchLayout:
    """How one optimiser step is made of micro-batches, and how many steps the run takes."""

    micro_batch: int
    grad_accum: int
    world_size: int
    seq_len: int
    steps: int

    @property
    def tokens_per_step(self) -> int:
        """Tokens (or points, for vector tasks) in one optimiser step over all processes."""
        return self.micro_batch * self.grad_accum * self.world_size * self.seq_len


def batch_layout(train: TrainConfig, task: Task, world_size: int) -> BatchLayout:
    """Gradient accumulation and the number of steps, or a HeadwiseError when they cannot work out."""
    per_micro = train.micro_batch * task.seq_len * world_size
    if train.tokens_per_step is not None:
        if train.tokens_per_step % per_micro:
            raise HeadwiseError(
                f"train.tokens_per_step {train.tokens_per_step} is not a multiple of micro_batch x seq_len x processes "
                f"= {train.micro_batch} x {task.seq_len} x {world_size} = {per_micro}; "
                f"nearest valid: {max(1, round(train.tokens_per_step / per_micro)) * per_micro}"
            )
        grad_accum = train.tokens_per_step // per_micro
    else:
        grad_accum = train.grad_accum or 1
    per_step = per_micro * grad_accum
    if train.steps is not None:
        steps = train.steps
    elif train.tokens is not None:
        steps = math.ceil(train.tokens / per_step)
    else:
        per_epoch = task.tokens_per_epoch()
        if per_epoch is None:
            raise HeadwiseError("train.epochs needs a task with a finite dataset; this task is endless: use train.steps")
        if per_epoch < per_step:
            raise HeadwiseError(
                f"one optimiser step ({per_step} tokens) is larger than the training data ({per_epoch} tokens): "
                "lower micro_batch or grad_accum"
            )
        steps = math.ceil(train.epochs * per_epoch / per_step)
    return BatchLayout(train.micro_batch, grad_accum, world_size, task.seq_len, steps)


def warmup_steps(schedule: ScheduleConfig, steps: int) -> int:
    """Warm-up length in optimiser steps."""
    if schedule.warmup_frac is not None:
        return int(round(schedule.warmup_frac * steps))
    return schedule.warmup_steps or 0


def min_lr(cfg: RunConfig) -> float:
    """The floor of the cosine decay."""
    return cfg.schedule.min_lr if cfg.schedule.min_lr is not None else 0.1 * cfg.optim.lr


def resolved_config(cfg: RunConfig, spec: ModelSpec) -> RunConfig:
    """The config to save with a run: the model as a full spec (preset and plan applied), with
    ``[model.plan]`` kept beside the heads it gave, and every default filled in, so that training
    it again reproduces the run."""
    data = cfg.to_dict()
    plan = data["model"].get("plan")
    data["model"] = spec.to_dict()
    if plan is not None:
        data["model"]["plan"] = plan
    data["schedule"]["min_lr"] = min_lr(cfg)
    return RunConfig.parse(data, source="resolved config")
