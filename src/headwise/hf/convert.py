"""What the converters to and from ``transformers`` architectures (:mod:`headwise.hf.gpt_neo`,
:mod:`headwise.hf.vit`, :mod:`headwise.hf.llama`) share: the check that a spec meets what an
architecture fixes, its attention kinds' names there, and the copy of the weights between the two
layouts (headwise fuses q, k and v into one projection, and a gated MLP's value and gate maps;
``transformers`` keeps them apart)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headwise.errors import HeadwiseError
from headwise.model.attention import ATTENTION_KINDS
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec


def check_expressible(spec: ModelSpec, incompatibility: Callable[[ModelSpec], str | None], arch: str) -> None:
    """Raise a HeadwiseError with the reason when the architecture named ``arch`` cannot express ``spec``."""
    reason = incompatibility(spec)
    if reason:
        raise HeadwiseError(f"cannot convert to {arch}: {reason}")


def fixed_field_problem(spec: ModelSpec, fixed: list[tuple[str, object, str]]) -> str | None:
    """The first of ``fixed`` (spec field, the value an architecture requires, why) that ``spec``
    does not meet, as a reason; None when it meets them all."""
    for field, value, why in fixed:
        if getattr(spec, field) != value:
            return f"{field} = {getattr(spec, field)!r}: {why}"
    return None


def kind_problem(spec: ModelSpec, arch: str, label: str) -> str | None:
    """Why the architecture ``arch`` (its key in ``AttentionKind.hf_names``; ``label`` names it)
    has no layers of some attention kind of ``spec``; None when it has them all."""
    missing = sorted({s.attention for s in spec.layers()} - set(arch_kinds(arch)))
    if not missing:
        return None
    names = arch_kinds(arch)
    has = f"all {names[0]}" if len(names) == 1 else " or ".join(names)
    return f"it has {' and '.join(missing)} attention layers; {label}'s layers are {has}"


def arch_kinds(arch: str) -> list[str]:
    """The attention kinds the architecture ``arch`` has, sorted."""
    return [name for name, kind in ATTENTION_KINDS.items() if arch in kind.hf_names]


def kinds_to_arch(spec: ModelSpec, arch: str) -> list[str]:
    """Each layer's attention kind as ``arch`` names it."""
    return [ATTENTION_KINDS[s.attention].hf_names[arch] for s in spec.layers()]


def kinds_from_arch(names: list[str], arch: str) -> list[str]:
    """The attention kinds of layers that ``arch`` calls ``names``."""
    ours = {ATTENTION_KINDS[k].hf_names[arch]: k for k in arch_kinds(arch)}
    unknown = sorted(set(names) - set(ours))
    if unknown:
        raise HeadwiseError(f"cannot convert: attention layers {', '.join(unknown)} have no headwise kind "
                            f"(headwise has {', '.join(ours)})")
    return [ours[n] for n in names]


def options_to_arch(spec: ModelSpec, arch: str) -> dict[str, Any]:
    """The config fields of ``arch`` that hold attention kinds' options, set from ``spec``."""
    return {theirs: getattr(spec, ours) for _, kind in ATTENTION_KINDS.items()
            for theirs, ours in kind.hf_config.get(arch, {}).items()}


def options_from_arch(config: Any, arch: str) -> dict[str, Any]:
    """The attention kinds' options that a config of ``arch`` holds, as spec fields."""
    return {ours: getattr(config, theirs) for _, kind in ATTENTION_KINDS.items()
            for theirs, ours in kind.hf_config.get(arch, {}).items()}


def block_pairs(n_layers: int, prefix: str, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(headwise name, transformers name) of the weight and bias of each block's modules:
    ``names`` pairs a headwise module (``"mlp.fc"``) with its transformers name under
    ``f"{prefix}{i}."`` (``"mlp.c_fc"`` under ``"transformer.h.{i}."``)."""
    return [(f"blocks.{i}.{a}.{p}", f"{prefix}{i}.{b}.{p}")
            for i in range(n_layers) for a, b in names for p in ("weight", "bias")]


@dataclass(frozen=True)
class Layout:
    """Where an architecture keeps a headwise model's weights."""

    #: (headwise key, its key) of every weight but q, k and v, for a spec; a weight is copied as
    #: it is, reshaped (ViT keeps the positions as [1, T, d])
    pairs: Callable[[ModelSpec], list[tuple[str, str]]]
    #: its q, k and v keys of layer i's ``"weight"`` (or ``"bias"``)
    qkv: Callable[[int, str], list[str]]
    #: (headwise key, its keys) of the other weights headwise joins along their first dimension
    #: (a gated MLP's value and gate maps), for a spec
    joined: Callable[[ModelSpec], list[tuple[str, list[str]]]] = lambda spec: []


@torch.no_grad()
def copy_weights(model: Transformer, hf: Any, layout: Layout, to_hf: bool) -> None:
    """Copy every weight from ``model`` into ``hf`` (``to_hf``) or back, laid out as ``layout`` says."""
    spec = model.spec
    ours, theirs = model.state_dict(), hf.state_dict()
    for a, b in layout.pairs(spec):
        source, target = (ours[a], theirs[b]) if to_hf else (theirs[b], ours[a])
        target.copy_(source.reshape(target.shape))
    joined = [(f"blocks.{i}.attn.qkv.{part}", layout.qkv(i, part))
              for i in range(spec.n_layers) for part in (("weight", "bias") if spec.qkv_bias else ("weight",))]
    for key, names in joined + layout.joined(spec):
        # the parts' sizes are theirs: q, k and v of a layer with fewer KV heads differ
        fused = ours[key]
        if to_hf:
            for name, w in zip(names, fused.split([theirs[name].shape[0] for name in names], dim=0)):
                theirs[name].copy_(w)
        else:
            fused.copy_(torch.cat([theirs[name] for name in names]))


def to_architecture(model: Transformer, hf: Any, layout: Layout) -> Any:
    """``hf`` (a new ``transformers`` model of ``model``'s config) with exactly ``model``'s weights,
    in eval mode."""
    copy_weights(model, hf.eval(), layout, to_hf=True)
    return hf


def from_architecture(hf: Any, spec: ModelSpec, layout: Layout) -> Transformer:
    """A headwise Transformer of ``spec`` (in eval mode) with exactly the weights of ``hf``."""
    model = Transformer(spec).eval()
    copy_weights(model, hf, layout, to_hf=False)
    return model
