"""The architectures headwise converts to and from, as records (:class:`Architecture`) in one
registry (:func:`headwise.hf.architectures.architectures`): ``GPTNeoForCausalLM`` (:mod:`headwise.hf.gpt_neo`),
``ViTForImageClassification`` (:mod:`headwise.hf.vit`), ``LlamaForCausalLM`` and
``Qwen3ForCausalLM`` (:mod:`headwise.hf.llama`), ``LagunaForCausalLM`` (:mod:`headwise.hf.laguna`)
and OpenELM (:mod:`headwise.hf.openelm`, remote code).

A record says which spec fields its config holds (``maps``), which it fixes (``fixed``), its
config both ways and where it keeps the weights. What it cannot express is worked out here, once
(:meth:`Architecture.incompatibility`): every spec field it neither maps nor fixes must be at its
default. The weights are copied between the two layouts: headwise fuses q, k and v into one
projection, and a gated MLP's value and gate maps; ``transformers`` keeps them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from headwise.errors import HeadwiseError
from headwise.model.attention import ATTENTION_KINDS
from headwise.model.features import ACTIVATIONS
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec

#: what an architecture fixes of a spec: (spec field, the value it requires, why)
Fixed = tuple[str, object, str]
#: per-layer quantities an architecture may have one of for all layers: spec field -> (how a
#: refusal names them, their values in a spec)
PER_LAYER: dict[str, tuple[str, Callable[[ModelSpec], list[int]]]] = {
    "heads": ("head counts", lambda s: list(s.heads)),
    "kv_heads": ("key/value heads", lambda s: s.kv_heads_per_layer),
    "head_dim": ("head widths", lambda s: s.head_dims),
    "mlp_hidden": ("MLP widths", lambda s: [layer.mlp_hidden for layer in s.layers()]),
}
#: what an architecture reads and ends in, as refusals say it
READS = {"tokens": "token ids", "images": "images"}
ENDS_IN = {"lm": "a language-model head", "classes": "a classifier"}


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


@dataclass(frozen=True)
class Architecture:
    """One architecture headwise converts to and from: what of a spec its config holds, what it
    fixes, its config both ways and where it keeps the weights."""

    #: its name in the registry (``headwise export --native``, ``headwise convert --class``)
    name: str
    #: its ``model_type``, and its key in ``AttentionKind.hf_names``
    arch: str
    #: how refusals name it
    label: str
    #: its ``transformers`` model class (None: remote code, whose config is a dict)
    model_class: str | None
    #: what it reads (``inputs``) and ends in (the output head)
    inputs: str
    head: str
    #: the spec fields its config holds, or its ``rules`` check
    maps: frozenset[str]
    #: what it fixes; a spec read from its config gets these values
    fixed: tuple[Fixed, ...]
    #: its config's fields of a spec it expresses
    write: Callable[[ModelSpec], dict[str, Any]]
    #: the spec fields (beyond ``fixed``) of one of its configs; a HeadwiseError where headwise has none
    read: Callable[[Any], dict[str, Any]]
    #: the per-layer quantities (keys of :data:`PER_LAYER`) it has one of, with its config field
    uniform: tuple[tuple[str, str], ...] = ()
    #: its own checks (reasons or None), after what it reads and ends in and its uniform quantities
    rules: tuple[Callable[[ModelSpec], str | None], ...] = ()
    #: where it keeps the weights (None: its module copies them)
    layout: Layout | None = None

    def kinds(self) -> list[str]:
        """The attention kinds it has (an architecture that no kind names has global layers only)."""
        return [name for name, kind in ATTENTION_KINDS.items() if self.arch in kind.hf_names] or ["global"]

    def at_default(self) -> list[str]:
        """The spec fields it can only take at their defaults: those it neither maps nor fixes, but
        the options of attention kinds (its config holds those of its kinds, ``AttentionKind.hf_config``;
        its kinds check refuses layers of the others)."""
        options = {option for name, kind in ATTENTION_KINDS.items() for option in kind.options
                   if name not in self.kinds() or option in kind.hf_config.get(self.arch, {}).values()}
        covered = self.maps | {f for f, _, _ in self.fixed} | options | {"inputs", "outputs"}
        return [f for f in ModelSpec.model_fields if f not in covered]

    def incompatibility(self, spec: ModelSpec) -> str | None:
        """Why it cannot express ``spec`` (one line), or None when it can."""
        if spec.inputs != self.inputs:
            return f"it reads {spec.inputs}, not {self.inputs}; {self.label} reads {READS[self.inputs]}"
        if spec.output_head != self.head:
            return f"outputs = {spec.output_head!r}: {self.model_class or self.label} ends in {ENDS_IN[self.head]}"
        for field, theirs in self.uniform:
            name, values = PER_LAYER[field][0], PER_LAYER[field][1](spec)
            if len(set(values)) != 1:
                return f"its layers have different {name} {values}; {self.label} has one {theirs} for all layers"
        for rule in self.rules:
            if reason := rule(spec):
                return reason
        for field, value, why in self.fixed:
            if getattr(spec, field) != value:
                return f"{field} = {getattr(spec, field)!r}: {why}"
        missing = sorted({s.attention for s in spec.layers()} - set(self.kinds()))
        if missing:
            has = f"all {self.kinds()[0]}" if len(self.kinds()) == 1 else " or ".join(self.kinds())
            return f"it has {' and '.join(missing)} attention layers; {self.label}'s layers are {has}"
        for field in self.at_default():
            value, default = getattr(spec, field), ModelSpec.model_fields[field].default
            if value != default:
                return f"{field} = {value!r}: {self.label} has no such setting (only headwise's default {default!r})"
        return None

    def check(self, spec: ModelSpec) -> None:
        """Raise a HeadwiseError with the reason when it cannot express ``spec``."""
        reason = self.incompatibility(spec)
        if reason:
            raise HeadwiseError(f"cannot convert to {self.label}: {reason}")

    def to_config(self, spec: ModelSpec) -> Any:
        """Its config equal to ``spec`` (a dict for remote code); a HeadwiseError if it cannot express it."""
        self.check(spec)
        if self.model_class is None:
            return self.write(spec)
        import transformers

        return getattr(transformers, self.model_class).config_class(**self.write(spec))

    def spec_from_config(self, config: Any) -> ModelSpec:
        """The ModelSpec of one of its configs; a HeadwiseError where headwise cannot express it."""
        model_type = config.get("model_type", self.arch) if isinstance(config, Mapping) else config.model_type
        if model_type != self.arch:
            raise HeadwiseError(f"cannot convert a {model_type!r} model as {self.label}")
        fixed = {f: v for f, v, _ in self.fixed}
        return ModelSpec(**{**fixed, "inputs": self.inputs, **self.read(config)})

    def to_hf(self, model: Transformer, attn_implementation: str | None = None) -> Any:
        """Its ``transformers`` model with exactly ``model``'s weights, in eval mode, running
        ``attn_implementation`` where given ("sdpa", "eager")."""
        import transformers

        hf = getattr(transformers, self.model_class)(self.to_config(model.spec))
        if attn_implementation:
            hf.set_attn_implementation(attn_implementation)
        copy_weights(model, hf.eval(), self.layout, to_hf=True)
        return hf

    def from_hf(self, hf: Any) -> Transformer:
        """A headwise Transformer (in eval mode) with exactly the weights of its model ``hf``."""
        model = Transformer(self.spec_from_config(hf.config)).eval()
        copy_weights(model, hf, self.layout, to_hf=False)
        return model


def kinds_to_arch(spec: ModelSpec, arch: str) -> list[str]:
    """Each layer's attention kind as ``arch`` names it."""
    return [ATTENTION_KINDS[s.attention].hf_names[arch] for s in spec.layers()]


def kind_fields(names: list[str], arch: str, config: Any) -> dict[str, Any]:
    """The spec fields of layers that ``arch`` calls ``names``: their kinds, and the options of the
    kinds used, read from ``config``."""
    ours = {kind.hf_names[arch]: name for name, kind in ATTENTION_KINDS.items() if arch in kind.hf_names}
    unknown = sorted(set(names) - set(ours))
    if unknown:
        raise HeadwiseError(f"cannot convert: attention layers {', '.join(unknown)} have no headwise kind "
                            f"(headwise has {', '.join(ours)})")
    kinds = [ours[n] for n in names]
    options = {mine: getattr(config, theirs) for k in set(kinds)
               for theirs, mine in ATTENTION_KINDS[k].hf_config.get(arch, {}).items()}
    return {"attention": kinds, **options}


def options_to_arch(spec: ModelSpec, arch: str) -> dict[str, Any]:
    """The config fields of ``arch`` that hold attention kinds' options, set from ``spec``."""
    return {theirs: getattr(spec, ours) for _, kind in ATTENTION_KINDS.items()
            for theirs, ours in kind.hf_config.get(arch, {}).items()}


def hidden_act(spec: ModelSpec, label: str) -> str | None:
    """Why ``label``'s ungated MLP (``transformers``' ``hidden_act``) has no ``spec.activation``; None when it has."""
    if ACTIVATIONS[spec.activation].hidden_act is None:
        return f"activation = {spec.activation!r} is gated; {label}'s MLP is not"
    return None


def activation_of(act: str, label: str) -> str:
    """headwise's activation of the ``hidden_act`` ``act`` of a ``label`` config."""
    known = {a.hidden_act: name for name, a in ACTIVATIONS.items() if a.hidden_act is not None}
    if act not in known:
        raise HeadwiseError(f"cannot convert from {label}: hidden_act = {act!r}; headwise has "
                            f"{', '.join(sorted(known.values()))}")
    return known[act]


def one_kv_per_head(spec: ModelSpec, label: str) -> str | None:
    """Why ``label``, whose every query head has its own key/value head, cannot express ``spec``."""
    if spec.kv_heads_per_layer != spec.heads:
        return f"it has {spec.kv_heads_per_layer} key/value heads per layer; {label} has one per query head"
    return None


def block_pairs(n_layers: int, prefix: str, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(headwise name, transformers name) of the weight and bias of each block's modules:
    ``names`` pairs a headwise module (``"mlp.fc"``) with its transformers name under
    ``f"{prefix}{i}."`` (``"mlp.c_fc"`` under ``"transformer.h.{i}."``)."""
    return [(f"blocks.{i}.{a}.{p}", f"{prefix}{i}.{b}.{p}")
            for i in range(n_layers) for a, b in names for p in ("weight", "bias")]


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
