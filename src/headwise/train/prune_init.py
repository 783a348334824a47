"""``[train.prune]``: prune the ``train.init_from`` model, then train the smaller one (prune + heal
as one run; with ``[train.distill]`` naming the same run, the unpruned model teaches).

``[model]`` is the init_from model's (checked as any fine-tuning's, :mod:`headwise.train.init_from`).
Its heads are scored on the run's own training batches (a stream of seed ``train.seed``, never the
evaluation split) by ``method`` (:mod:`headwise.analysis.head_importance`) and pruned to the budget
within ``scope`` (:func:`~headwise.analysis.head_pruning.plan_pruning`, counted as ``headwise heads
prune`` and ``headwise search`` count it). The heads removed are saved in the run's ``pruned.json``
(as ``headwise heads prune`` writes it), once: a resumed run rebuilds the same shape from it and its
checkpoint, and scores nothing again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headwise.analysis.head_importance import score_heads
from headwise.analysis.head_pruning import Removed, plan_pruning, prune_model, pruned_spec
from headwise.budget import parse_budget
from headwise.errors import HeadwiseError
from headwise.params import plan_budget
from headwise.plans import Plan
from headwise.spec import ModelSpec
from headwise.tasks.base import Task
from headwise.train.config import PruneConfig
from headwise.train.init_from import InitSource

#: the record of what was pruned, in the run folder (the name ``headwise heads prune`` writes)
PRUNED_JSON = "pruned.json"


@dataclass(frozen=True)
class Pruned:
    """The pruned init_from model, the heads it lost and the record saved beside the run."""

    model: nn.Module
    removed: Removed
    record: dict


def prune_source(config: PruneConfig, source: InitSource, spec: ModelSpec, task: Task, seed: int,
                 device: torch.device) -> Pruned:
    """The init_from model of ``spec`` (whose files ``check_init_source`` verified) pruned as
    ``config`` asks, its heads scored on ``device`` on ``task``'s training batches drawn with
    ``seed``. A budget the model already meets, or that no pruning meets, is a HeadwiseError."""
    from headwise.model.pretrained import load_pretrained

    budget = parse_budget(config.to)
    model = load_pretrained(source.model_dir, verify=False).to(device)
    inputs, targets = (t.to(device) for t in training_sample(task, config.tokens, seed))
    scores = score_heads(model, inputs, targets, task.loss, (config.method,))[config.method]

    def measure(s: ModelSpec) -> int:
        return plan_budget(s, task.seq_len, budget.dtype)[budget.metric]

    where = f"train.prune.to = {config.to!r}: "
    try:
        removed = plan_pruning(spec, scores, config.scope, measure, budget.max, budget.describe())
    except HeadwiseError as exc:
        raise HeadwiseError(where + str(exc)) from None
    after = pruned_spec(spec, removed)
    record = {"source": str(source.run), "checkpoint": source.checkpoint, "method": config.method,
              "scores": {"tokens": inputs.numel(), "split": "train", "seed": seed}, "scope": config.scope,
              "budget": budget.describe(), "removed": [list(r) for r in removed],
              "before": {"heads": list(spec.heads), **plan_budget(spec, task.seq_len)},
              "after": {"heads": list(after.heads), **plan_budget(after, task.seq_len)},
              "head_scores": scores.to_dict()}
    return Pruned(prune_model(model, removed), removed, record)


def prune_for_run(config: PruneConfig, run: Path, source: InitSource | None, spec: ModelSpec, task: Task, seed: int,
                  device: torch.device) -> tuple[ModelSpec, Plan, nn.Module | None, dict | None]:
    """What a ``[train.prune]`` run trains: the spec and plan of ``spec`` (the init_from model's)
    pruned by :func:`prune_source`, the pruned model and its record for ``pruned.json``; or,
    resuming (no ``source``: the checkpoint holds the weights), the shape ``run``'s ``pruned.json``
    saved, with no model or record."""
    if source is None:
        after = saved_pruning(run, spec)
        return after, pruned_plan(after), None, None
    pruned = prune_source(config, source, spec, task, seed, device)
    after = pruned_spec(spec, pruned.removed)
    return after, pruned_plan(after), pruned.model, pruned.record


def training_sample(task: Task, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [N, T] of ``ceil(tokens / T)`` training sequences (T the task's block
    size), the first ones of a training stream of ``seed``."""
    stream = task.train_stream(1, seed=seed)
    batches = [next(stream) for _ in range(math.ceil(tokens / task.seq_len))]
    return torch.cat([b.inputs for b in batches]), torch.cat([b.targets for b in batches])


def saved_pruning(run: Path, spec: ModelSpec) -> ModelSpec:
    """The pruned spec a resumed run was pruned to: ``spec`` (the init_from model's) without the
    heads its ``pruned.json`` names."""
    path = Path(run) / PRUNED_JSON
    try:
        removed: Removed = tuple(tuple(int(h) for h in layer) for layer in json.loads(path.read_text())["removed"])
    except FileNotFoundError:
        raise HeadwiseError(f"{path} is missing: this run was not pruned by [train.prune], so it cannot resume "
                            "with it (remove [train.prune], or start a new run)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeadwiseError(f"{path} is damaged ({type(exc).__name__}): the pruned shape cannot be rebuilt; "
                            "start a new run") from None
    if len(removed) != spec.n_layers:
        raise HeadwiseError(f"{path} prunes {len(removed)} layers, the model has {spec.n_layers}: start a new run")
    return pruned_spec(spec, removed)


def pruned_plan(spec: ModelSpec) -> Plan:
    """The explicit plan of a pruned spec: its heads, head widths and key/value heads per layer."""
    plan = Plan.explicit(spec.heads, spec.head_dims)
    return plan.with_kv_heads(spec.kv_heads_per_layer) if spec.kv_heads is not None else plan


def write_record(run: Path, record: dict | None) -> None:
    """``pruned.json`` in the run folder (nothing without a record: a resumed run keeps its own)."""
    from headwise.config import atomic_write_text

    if record is None:
        return
    atomic_write_text(Path(run) / PRUNED_JSON, json.dumps(record, indent=2) + "\n")
