"""Pruning a model's attention heads by their scores (:mod:`headwise.analysis.head_importance`):
which heads go to meet a budget (a per-layer allocation), and the smaller model that keeps the
other heads' weights.

A layer loses its heads in **units**, lowest score first, and keeps at least one:

- a layer with one key/value head per query head loses one head at a time, with its key and value;
- a grouped-query layer keeps its key/value heads and loses one query head from *every* group at
  a time (each group's lowest-scoring one still there), so its groups stay equal in size and
  each keeps at least one query head. This is how Minitron (Muralidharan et al. 2024) pruned
  Nemotron's grouped heads (48 query heads over 8 key/value heads to 24 over 8); it is the
  only choice that headwise's layers can hold for any scores (a layer's groups are equal runs of
  consecutive query heads), and it gives per-layer query heads over unchanged key/value heads,
  which transformers' Laguna holds natively. Its price: a grouped layer's key/value cache cannot
  shrink, so a KV-bytes budget is met by the other layers alone.

A unit's score is the mean of its heads' scores (so a unit of several heads competes with a
single head on the same footing). Scopes:

- ``global``: every layer's units compete, lowest first; a unit that would not lower the budget's
  metric (a grouped layer's under a KV-bytes budget) is passed over; pruning stops as soon as the
  metric is at most the budget: this is what gives a per-layer allocation;
- ``per-layer``: the same number of units goes from every layer (a layer with fewer keeps one
  head per group), the smallest number that meets the budget: the uniform baseline.

The budget is a cap on a metric of the pruned spec that the caller counts (``measure``:
headwise's own counts, :func:`headwise.params.plan_budget`), so the pruned plan is counted exactly
as a search counts it. The pruned model (:func:`prune_model`) computes exactly what the original
computes with the pruned heads' outputs gated to 0 (:func:`~headwise.analysis.head_importance.head_gates`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from headwise.analysis.head_importance import HeadScores, LayerScores, groups_of
from headwise.errors import HeadwiseError
from headwise.spec import LayerShape, ModelSpec

SCOPES = ("global", "per-layer")

#: the heads removed from each layer (query head indices, ascending)
Removed = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Unit:
    """Query heads of one layer that are removed together, and their mean score."""

    layer: int
    heads: tuple[int, ...]
    score: float


def layer_units(layer: int, shape: LayerShape, scores: Sequence[float]) -> list[Unit]:
    """The units layer ``layer`` can lose, in the order it loses them (the lowest scores first;
    what is left after all of them: one head, or one query head per key/value group)."""
    def ascending(heads: list[int]) -> list[int]:
        return sorted(heads, key=lambda h: (scores[h], h))

    groups = groups_of(shape)
    if groups is None:
        return [Unit(layer, (h,), scores[h]) for h in ascending(list(range(shape.heads)))[:-1]]
    ranked = [ascending(g) for g in groups]
    units = []
    for j in range(len(groups[0]) - 1):
        heads = tuple(sorted(r[j] for r in ranked))
        units.append(Unit(layer, heads, sum(scores[h] for h in heads) / len(heads)))
    return units


def pruned_spec(spec: ModelSpec, removed: Removed) -> ModelSpec:
    """``spec`` without the ``removed`` heads: each layer's heads fewer, its head width as it was
    (set per layer, as heads no longer divide ``d_model`` the same way), its key/value heads as
    many as before in a grouped layer, one per remaining head in any other."""
    shapes = spec.layers()
    heads = [s.heads - len(r) for s, r in zip(shapes, removed)]
    kv = [s.kv_heads if groups_of(s) is not None else h for s, h in zip(shapes, heads)]
    fields = {**spec.model_dump(), "heads": heads,
              "head_dim": spec.head_dim if spec.head_dim is not None else [s.head_dim for s in shapes],
              "kv_heads": None if spec.kv_heads is None else kv}
    return type(spec).model_validate(fields)


def _global(units: list[list[Unit]], value: Callable[[Removed], int]) -> Iterator[Removed]:
    """Allocations removing ever more units, the lowest-scoring first across the layers; a unit
    that would not lower the metric (``value`` of an allocation) is passed over."""
    removed: Removed = tuple(() for _ in units)
    current = value(removed)
    for unit in sorted((u for layer in units for u in layer), key=lambda u: (u.score, u.layer, u.heads)):
        candidate = tuple(tuple(sorted(r + unit.heads)) if i == unit.layer else r for i, r in enumerate(removed))
        after = value(candidate)
        if after < current:
            removed, current = candidate, after
            yield removed


def _uniform(units: list[list[Unit]]) -> Iterator[Removed]:
    """Allocations removing the same number of units from every layer, one more at a time."""
    for k in range(1, max(len(layer) for layer in units) + 1):
        yield tuple(tuple(sorted(h for u in layer[:k] for h in u.heads)) for layer in units)


def plan_pruning(spec: ModelSpec, scores: HeadScores, scope: str, measure: Callable[[ModelSpec], int],
                 limit: int, budget: str) -> Removed:
    """The heads to remove from each layer of ``spec`` so that ``measure`` of the pruned spec is
    at most ``limit`` (``budget``: how messages name it), chosen by ``scores`` within ``scope``
    (:data:`SCOPES`). A budget the model already meets, or that pruning cannot meet, is a
    HeadwiseError."""
    if scope not in SCOPES:
        raise HeadwiseError(f"unknown scope {scope!r}: use {' or '.join(SCOPES)}")
    shapes = spec.layers()
    if [len(layer.heads) for layer in scores.layers] != [s.heads for s in shapes]:
        raise HeadwiseError(f"the {scores.method} scores are of heads {[len(layer.heads) for layer in scores.layers]}, "
                            f"the model's heads are {spec.heads}: score this model")
    before = measure(spec)
    if before <= limit:
        raise HeadwiseError(f"the model already meets the budget {budget} ({before}): there is nothing to prune")
    units = [layer_units(i, s, layer.heads) for i, (s, layer) in enumerate(zip(shapes, scores.layers))]

    def value(removed: Removed) -> int:
        return measure(pruned_spec(spec, removed))

    for removed in (_global(units, value) if scope == "global" else _uniform(units)):
        if value(removed) <= limit:
            return removed
    least = value(tuple(tuple(sorted(h for u in layer for h in u.heads)) for layer in units))
    raise HeadwiseError(f"no pruning meets the budget {budget}: with one head left in each layer (one query head per "
                        f"key/value group in a grouped layer, whose key/value heads stay) the model still counts "
                        f"{least}; give a budget of at least {least}")


def _head_slices(attn: nn.Module, shape: LayerShape, removed: tuple[int, ...]) -> dict[str, tuple[int, Tensor]]:
    """For each per-head weight of one attention layer (its name under the layer), the dimension
    and indices that keep the heads not ``removed``: the fused projection's rows of their queries
    (and of the key/value heads that stay), the output projection's columns, the output gate's
    rows (one per head, or one per channel), the Nyström convolution's kernels."""
    d, kv = shape.head_dim, shape.kv_heads
    kept = [h for h in range(shape.heads) if h not in removed]
    kept_kv = kept if groups_of(shape) is None else list(range(kv))

    def channels(heads: list[int], offset: int = 0) -> Tensor:
        return torch.tensor([offset + h * d + c for h in heads for c in range(d)], dtype=torch.long)

    q = channels(kept)
    qkv = torch.cat([q, channels(kept_kv, shape.width), channels(kept_kv, shape.width + kv * d)])
    gate = getattr(attn, "output_gate", None)
    heads = torch.tensor(kept, dtype=torch.long)
    return {"qkv.weight": (0, qkv), "qkv.bias": (0, qkv), "out.weight": (1, q),
            "gate.weight": (0, heads if gate is not None and gate.per_head else q), "conv.weight": (0, heads)}


def prune_model(model: nn.Module, removed: Removed) -> nn.Module:
    """A new model of :func:`pruned_spec` (same dtype, device and mode) whose weights are
    ``model``'s without the ``removed`` heads': it computes what ``model`` computes with those heads'
    outputs gated to 0. A per-head weight headwise does not know how to slice (a family's attention
    kind's) is a HeadwiseError."""
    spec = pruned_spec(model.spec, removed)
    param = next(model.parameters())
    smaller = spec.build().to(dtype=param.dtype, device=param.device)
    state = model.state_dict()
    for i, (shape, gone) in enumerate(zip(model.spec.layers(), removed)):
        for key, (dim, index) in _head_slices(model.blocks[i].attn, shape, gone).items():
            name = f"blocks.{i}.attn.{key}"
            if name in state:
                state[name] = state[name].index_select(dim, index.to(state[name].device))
    target = smaller.state_dict()
    for name, value in target.items():
        if state[name].shape != value.shape:
            raise HeadwiseError(f"{name} has a per-head shape that pruning cannot slice ({list(state[name].shape)} for "
                                f"{list(value.shape)}): this attention kind's heads cannot be pruned")
    smaller.load_state_dict(state)
    return smaller.train(model.training)


def read_scores(path: Path, method: str, shapes: Sequence[LayerShape], weights: tuple[str, str],
                rescore: str) -> HeadScores:
    """The ``method`` scores of a ``head_scores.json`` (``headwise heads score``'s record), checked
    against the model they prune: ``weights`` (its folder, and the sha256 of its weights file) must
    be the weights scored, and its layers ``shapes`` have one finite score per head. ``rescore``:
    the command that scores these weights, which a refusal names."""
    not_scores = (f"--scores {path} is not a head scores record ({{}}): give the head_scores.json headwise heads "
                  "score wrote")
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadwiseError(f"--scores {path} does not exist: give the head_scores.json headwise heads score "
                            "wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HeadwiseError(not_scores.format(type(exc).__name__)) from None
    if not isinstance(record, dict):
        raise HeadwiseError(not_scores.format("not a JSON object"))
    # A record without the sha256 (written before headwise recorded it) cannot show which weights it
    # scored: another run's scores would prune the wrong heads silently, so it is refused too.
    sha = record.get("weights_sha256")
    if sha is None:
        raise HeadwiseError(f"--scores {path} does not name the weights it scored (an older headwise wrote it): "
                            f"score {weights[0]} again with `{rescore}`")
    if sha != weights[1]:
        raise HeadwiseError(f"--scores {path} scored other weights ({record.get('model')}, sha256 {str(sha)[:12]}) "
                            f"than those pruned ({weights[0]}, sha256 {weights[1][:12]}): score these with "
                            f"`{rescore}`")
    try:
        layers = record["methods"][method]["layers"]
        scores = [[float(v) for v in layer["heads"]] for layer in layers]
    except KeyError:
        raise HeadwiseError(f"--scores {path} has no {method!r} scores: score the run with --method {method}, or "
                            "prune by a method it holds") from None
    except (ValueError, TypeError) as exc:
        raise HeadwiseError(not_scores.format(type(exc).__name__)) from None
    if [len(layer) for layer in scores] != [s.heads for s in shapes]:
        raise HeadwiseError(f"--scores {path} scores heads {[len(layer) for layer in scores]}, but the run's model has "
                            f"heads {[s.heads for s in shapes]}: score this run")
    if not all(math.isfinite(v) for layer in scores for v in layer):
        raise HeadwiseError(f"--scores {path}: its {method} scores are not all finite numbers")
    return HeadScores(method, tuple(LayerScores(tuple(layer)) for layer in scores))
