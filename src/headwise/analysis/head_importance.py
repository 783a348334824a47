"""Per-head importance of a trained model: how much the loss leans on each attention head.

Each head's output (its ``head_dim`` slice of the output projection's input, ``blocks[i].attn.out``)
is multiplied by a gate, 1 by default, from outside the model: a forward pre-hook on the
projection (:func:`head_gates`), so any headwise model is scored as it was trained. Three methods:

- ``gradient`` (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): the mean over
  the sequences of ``|dL/d gate_h|`` at every gate 1, ``L`` a sequence's mean token loss;
- ``activation`` (Minitron, Muralidharan et al. 2024): the mean over tokens of the L2 norm of the
  head's output;
- ``ablation``: the loss with the head's gate at 0 minus the loss with every gate at 1 (one
  forward pass per head).

A layer with grouped key/value heads also scores each key/value group (its consecutive query
heads): the sum of its query heads' scores for ``gradient`` and ``activation``, the loss with
all of them gated off for ``ablation``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from headwise.errors import HeadwiseError
from headwise.spec import LayerShape
from headwise.train.config import RunConfig
from headwise.train.generate import run_task

METHODS = ("gradient", "activation", "ablation")
#: sequences per forward pass (every method's scores are the same for any size)
MICRO_BATCH = 8

#: the loss of logits [B, T, vocab] against target ids [B, T]: a mean over tokens
Loss = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class LayerScores:
    """One layer's scores by one method: one per query head, and one per key/value group where
    the layer groups its query heads (grouped-query attention), else None."""

    heads: tuple[float, ...]
    groups: tuple[float, ...] | None = None


@dataclass(frozen=True)
class HeadScores:
    """A model's head scores by one method (one of :data:`METHODS`), layer by layer."""

    method: str
    layers: tuple[LayerScores, ...]

    def ranked(self) -> list[tuple[float, int, int]]:
        """``(score, layer, head)`` of every query head, highest score first."""
        return sorted(((s, i, h) for i, layer in enumerate(self.layers) for h, s in enumerate(layer.heads)),
                      key=lambda r: (-r[0], r[1], r[2]))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method,
                "layers": [{"layer": i, "heads": list(layer.heads),
                            "groups": None if layer.groups is None else list(layer.groups)}
                           for i, layer in enumerate(self.layers)]}


def head_shapes(model: nn.Module) -> list[LayerShape]:
    """Each layer's shape (heads, head width, key/value heads), checked against the model: every
    layer must have an output projection that reads its heads' outputs side by side."""
    spec, blocks = getattr(model, "spec", None), getattr(model, "blocks", None)
    if spec is None or blocks is None:
        raise HeadwiseError(f"a {type(model).__name__} has no headwise attention layers: there are no heads to score")
    shapes = spec.layers()
    for i, (block, shape) in enumerate(zip(blocks, shapes)):
        out = getattr(getattr(block, "attn", None), "out", None)
        if not isinstance(out, nn.Linear) or out.in_features != shape.width:
            raise HeadwiseError(f"layer {i} ({shape.attention} attention) has no per-head output to gate: its heads "
                                "cannot be scored")
    return shapes


def groups_of(shape: LayerShape) -> list[list[int]] | None:
    """The query heads of each key/value group of a grouped-query layer (consecutive heads share
    a key/value head), or None for a layer with one key/value head per query head."""
    kv = shape.kv_heads or shape.heads
    if kv == shape.heads:
        return None
    size = shape.heads // kv
    return [list(range(g * size, (g + 1) * size)) for g in range(kv)]


@contextmanager
def head_gates(model: nn.Module, gates: list[Tensor | None],
               norms: list[Tensor] | None = None) -> Iterator[None]:
    """Within the block, layer ``i``'s head outputs are multiplied by ``gates[i]`` ([heads], or
    [B, heads]: one gate per sequence; None leaves the layer alone), and, given ``norms`` (one
    zero tensor [heads] per layer), the L2 norm of each head's output at every token is added to
    ``norms[i]`` (before the gate)."""
    handles = []

    def hook(shape: LayerShape, gate: Tensor | None, norm: Tensor | None):
        def pre(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
            x = args[0]
            b, t, _ = x.shape
            heads = x.reshape(b, t, shape.heads, shape.head_dim)
            if norm is not None:
                norm.add_(torch.linalg.vector_norm(heads.detach(), dim=-1).sum((0, 1)).to(norm.dtype))
            if gate is None:
                return None
            g = gate[:, None, :, None] if gate.dim() == 2 else gate[:, None]
            return ((heads * g).reshape(b, t, shape.width),) + args[1:]
        return pre

    try:
        for i, (block, shape) in enumerate(zip(model.blocks, head_shapes(model))):
            norm = None if norms is None else norms[i]
            handles.append(block.attn.out.register_forward_pre_hook(hook(shape, gates[i], norm)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _micro_batches(inputs: Tensor, targets: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    for i in range(0, inputs.shape[0], MICRO_BATCH):
        yield inputs[i:i + MICRO_BATCH], targets[i:i + MICRO_BATCH]


def mean_loss(model: nn.Module, inputs: Tensor, targets: Tensor, loss: Loss,
              gates: list[Tensor | None] | None = None) -> float:
    """The loss over the sequences ``inputs`` [N, T] (the mean of their losses), with the head
    ``gates`` of :func:`head_gates` (None: none)."""
    total = 0.0
    with torch.no_grad(), head_gates(model, gates or [None] * len(model.blocks)):
        for x, y in _micro_batches(inputs, targets):
            total += float(loss(model(x), y)) * x.shape[0]
    return total / inputs.shape[0]


def _group_sums(shape: LayerShape, heads: list[float]) -> tuple[float, ...] | None:
    groups = groups_of(shape)
    return None if groups is None else tuple(sum(heads[h] for h in g) for g in groups)


def gradient_scores(model: nn.Module, inputs: Tensor, targets: Tensor, loss: Loss) -> HeadScores:
    """Michel et al.'s importance: the mean over sequences of ``|dL/d gate_h|`` at gates 1."""
    shapes = head_shapes(model)
    param = next(model.parameters())
    sums = [torch.zeros(s.heads, dtype=torch.float64) for s in shapes]
    for x, y in _micro_batches(inputs, targets):
        # one gate per sequence and head: the gradient of the summed losses in a sequence's gate
        # is that sequence's own
        gates = [torch.ones(x.shape[0], s.heads, dtype=param.dtype, device=param.device, requires_grad=True)
                 for s in shapes]
        with head_gates(model, gates):
            logits = model(x)
        total = sum(loss(logits[r:r + 1], y[r:r + 1]) for r in range(x.shape[0]))
        for acc, grad in zip(sums, torch.autograd.grad(total, gates)):
            acc += grad.abs().sum(0).double().cpu()
    heads = [(acc / inputs.shape[0]).tolist() for acc in sums]
    return HeadScores("gradient", tuple(LayerScores(tuple(h), _group_sums(s, h)) for s, h in zip(shapes, heads)))


def activation_scores(model: nn.Module, inputs: Tensor) -> HeadScores:
    """Minitron's importance: the mean over tokens of the L2 norm of each head's output."""
    shapes = head_shapes(model)
    norms = [torch.zeros(s.heads, dtype=torch.float64, device=next(model.parameters()).device) for s in shapes]
    with torch.no_grad(), head_gates(model, [None] * len(shapes), norms):
        for i in range(0, inputs.shape[0], MICRO_BATCH):
            model(inputs[i:i + MICRO_BATCH])
    heads = [(n / inputs.numel()).tolist() for n in norms]
    return HeadScores("activation", tuple(LayerScores(tuple(h), _group_sums(s, h)) for s, h in zip(shapes, heads)))


def ablation_scores(model: nn.Module, inputs: Tensor, targets: Tensor, loss: Loss) -> HeadScores:
    """The loss with a head (or a key/value group's query heads) gated off, minus the loss with
    every head: one pass over the data per head and per group."""
    shapes = head_shapes(model)
    param = next(model.parameters())
    base = mean_loss(model, inputs, targets, loss)

    def without(layer: int, heads: list[int]) -> float:
        gate = torch.ones(shapes[layer].heads, dtype=param.dtype, device=param.device)
        gate[heads] = 0
        gates: list[Tensor | None] = [None] * len(shapes)
        gates[layer] = gate
        return mean_loss(model, inputs, targets, loss, gates) - base

    layers = []
    for i, shape in enumerate(shapes):
        groups = groups_of(shape)
        layers.append(LayerScores(tuple(without(i, [h]) for h in range(shape.heads)),
                                  None if groups is None else tuple(without(i, g) for g in groups)))
    return HeadScores("ablation", tuple(layers))


def score_heads(model: nn.Module, inputs: Tensor, targets: Tensor, loss: Loss,
                methods: tuple[str, ...] = METHODS) -> dict[str, HeadScores]:
    """The scores of every head of ``model`` by each of ``methods`` on the sequences ``inputs``
    [N, T] and their ``targets``, the model in evaluation mode (no dropout)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise HeadwiseError(f"unknown method {unknown[0]!r}: use {', '.join(METHODS)}")
    head_shapes(model)
    model.eval()
    compute = {"gradient": lambda: gradient_scores(model, inputs, targets, loss),
               "activation": lambda: activation_scores(model, inputs),
               "ablation": lambda: ablation_scores(model, inputs, targets, loss)}
    return {m: compute[m]() for m in methods}


def validation_sample(run_dir: Path, cfg: RunConfig, tokens: int) -> tuple[Tensor, Tensor, Loss]:
    """Inputs and targets [N, T] of a language run's validation text to score on, and its task's
    loss: ``ceil(tokens / T)`` sequences of ``T = min(tokens, block_size)`` tokens, evenly spaced
    over the text as the run's evaluation batches are (fewer where the text is shorter), encoded
    with the run's own tokenizer."""
    if not cfg.task.family.generates_text:
        raise HeadwiseError(f"{run_dir} is a {cfg.task.kind!r} run: heads are scored on a language run's "
                            "validation text")
    length = min(tokens, cfg.task.block_size)
    task_cfg = cfg.task.model_copy(update={"eval_batches": math.ceil(tokens / length), "eval_batch_size": 1})
    task = run_task(run_dir, cfg.model_copy(update={"task": task_cfg}))
    batches = task.eval_batches()
    inputs = torch.cat([b.inputs for b in batches])[:, :length]
    targets = torch.cat([b.targets for b in batches])[:, :length]
    return inputs, targets, task.loss
