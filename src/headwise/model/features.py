"""Block features: each setting of ``ModelSpec``'s ``norm``, ``positions``, ``activation``,
``qk_norm``, ``output_gate`` and ``embedding_norm`` as one record, as the attention kinds are
(:mod:`headwise.model.attention`): its exact parameters (:mod:`headwise.params`), the modules it
builds, what a spec with it must meet, its ``options`` (``ModelSpec`` fields refused under any
other setting) and its ``transformers`` name. The spec's settings are these records' names, so a
new setting is one record. No torch at import (the builders import it), so :mod:`headwise.spec`
reads the records without it, and an exported model carries this module (:mod:`headwise.hf.export`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Callable

from headwise.model.attention import Option

if TYPE_CHECKING:
    from torch import Tensor, nn

    from headwise.spec import LayerShape, ModelSpec


def _nothing(*args: Any) -> None:
    """No module; no requirement."""


def _torch_norm(module: str, spec: ModelSpec, width: int) -> nn.Module:
    # torch's RMSNorm in float32 computes Llama's LlamaRMSNorm to the bit: weight * x * rsqrt(mean(x^2) + eps)
    from torch import nn

    return getattr(nn, module)(width, eps=spec.layer_norm_eps)


def _unit_norm(spec: ModelSpec, width: int) -> nn.Module:
    from headwise.model.feature_modules import UnitNorm

    return UnitNorm()


@dataclass(frozen=True)
class Norm:
    """A normalisation: ``params(width)``, its parameters over ``width`` channels, and
    ``build(spec, width)``, its module (epsilon ``spec.layer_norm_eps``). ``pre`` (a block's
    ``norm``): before each sub-block, with a final norm after the blocks; else after each residual."""

    name: str
    params: Callable[[int], int]
    build: Callable[[ModelSpec, int], nn.Module]
    pre: bool = True


#: ``norm``: the blocks' normalisation. ``unitnorm_post``: ``scale * x / ||x||`` with one learned
#: scalar after each residual (Amsel et al.); ``rmsnorm_pre``: a weight and no bias (Llama)
NORMS = {norm.name: norm for norm in (Norm("layernorm_pre", lambda d: 2 * d, partial(_torch_norm, "LayerNorm")),
                                      Norm("unitnorm_post", lambda d: 1, _unit_norm, pre=False),
                                      Norm("rmsnorm_pre", lambda d: d, partial(_torch_norm, "RMSNorm")))}
#: ``qk_norm``: a norm of each head's q and one of its k over head_dim, before RoPE, one weight per
#: layer shared by its heads (Qwen3, OpenELM)
QK_NORMS = {"rmsnorm": Norm("rmsnorm", lambda d: d, partial(_torch_norm, "RMSNorm"))}
#: ``embedding_norm``: a norm of the sum of the front end's embeddings and positions, before the
#: blocks (BERT, cramming)
EMBEDDING_NORMS = {"layernorm": Norm("layernorm", lambda d: 2 * d, partial(_torch_norm, "LayerNorm"))}


def _learned(spec: ModelSpec) -> nn.Module:
    from torch import nn

    return nn.Embedding(spec.max_seq_len, spec.d_model)


def _scaled_sinusoid(spec: ModelSpec) -> nn.Module:
    from headwise.model.feature_modules import ScaledSinusoid

    return ScaledSinusoid(spec.max_seq_len, spec.d_model)


def _even_width(spec: ModelSpec) -> None:
    if spec.d_model % 2:
        raise ValueError(f"positions = 'scaled_sinusoid' pairs a sine and a cosine per frequency: d_model "
                         f"{spec.d_model} must be even")


def _rotary(spec: ModelSpec, shape: LayerShape) -> nn.Module:
    from headwise.model.rotary import Rotary

    return Rotary(int(shape.head_dim * spec.partial_rotary_factor), spec.rope_theta)


def _rotated_pairs(spec: ModelSpec) -> None:
    factor = spec.partial_rotary_factor
    if not 0 < factor <= 1:
        raise ValueError(f"partial_rotary_factor = {factor}: it is the share of each head's channels RoPE "
                         "rotates, in (0, 1]")
    for i, s in enumerate(spec.layers()):
        rotated = int(s.head_dim * factor)
        if rotated < 2 or rotated % 2:
            raise ValueError(f"layer {i}: head_dim {s.head_dim} x partial_rotary_factor {factor} rotates "
                             f"{rotated} channels; RoPE rotates pairs of channels: give an even count of at least 2")


@dataclass(frozen=True)
class Positions:
    """How a model knows where a position is: ``params(spec)`` and ``embedding(spec)``, the
    parameters and the module ``pos_emb`` of what is added to the front end's sequence (None:
    nothing); ``rotary(spec, shape)``, the module that turns a layer's q and k (None: none)."""

    name: str
    params: Callable[[ModelSpec], int]
    embedding: Callable[[ModelSpec], nn.Module | None] = _nothing
    rotary: Callable[[ModelSpec, LayerShape], nn.Module | None] = _nothing
    check: Callable[[ModelSpec], None] = _nothing
    options: dict[str, Option] = field(default_factory=dict)


#: ``positions``. ``scaled_sinusoid``: fixed interleaved sin/cos (base 10000) times one learned
#: scalar (cramming); ``rope``: rotary positions on each layer's q and k (:mod:`headwise.model.rotary`),
#: nothing added to the embeddings
POSITIONS = {p.name: p for p in (
    Positions("learned", lambda spec: spec.max_seq_len * spec.d_model, _learned),
    Positions("none", lambda spec: 0),
    Positions("scaled_sinusoid", lambda spec: 1, _scaled_sinusoid, check=_even_width),
    Positions("rope", lambda spec: 0, rotary=_rotary, check=_rotated_pairs, options={
        "rope_theta": Option(float, 10000.0, "the base of the rotary frequencies", gt=0),
        "partial_rotary_factor": Option(float, 1.0, "the share of each head's channels rotated, in (0, 1]: the "
                                        "first int(head_dim * factor) channels (GPT-NeoX's and Laguna's partial "
                                        "rotary); the rest pass")}),
)}


@dataclass(frozen=True)
class Activation:
    """The MLP's activation: the ``torch.nn.functional`` ``function`` (with ``kwargs``). A ``gated``
    one makes the first map ``mlp_hidden`` wide, a value half then a gate half, and the second map
    reads the ``mlp_hidden / 2`` products ``function(gate) * value``. ``hidden_act``: the name
    ``transformers`` (``ACT2FN``) gives an ungated one."""

    name: str
    function: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    gated: bool = False
    hidden_act: str | None = None

    @cached_property
    def _function(self) -> Callable[[Tensor], Tensor]:
        # looked up once, not in every MLP call: the records load without torch
        import torch.nn.functional as F

        return partial(getattr(F, self.function), **self.kwargs)

    def __call__(self, x: Tensor) -> Tensor:
        if not self.gated:
            return self._function(x)
        value, gate = x.chunk(2, dim=-1)
        return self._function(gate) * value

    def check(self, spec: ModelSpec) -> None:
        """A gated activation splits each layer's MLP width in halves: an odd one is refused."""
        for i, s in enumerate(spec.layers() if self.gated else []):
            if s.mlp_hidden % 2:
                raise ValueError(f"layer {i}: mlp_hidden = {s.mlp_hidden} is odd; activation = {self.name!r} splits "
                                 "it into value and gate halves: give an even width")


#: ``activation``. ``geglu``: exact-erf GELU of the gate (cramming's ``GLU``); ``swiglu``: SiLU of the
#: gate (Llama's MLP: the value is its ``up_proj``, the gate its ``gate_proj``)
ACTIVATIONS = {a.name: a for a in (Activation("gelu_new", "gelu", {"approximate": "tanh"}, hidden_act="gelu_new"),
                                   Activation("gelu", "gelu", hidden_act="gelu"),
                                   Activation("relu", "relu", hidden_act="relu"),
                                   Activation("geglu", "gelu", gated=True),
                                   Activation("swiglu", "silu", gated=True))}


@dataclass(frozen=True)
class OutputGate:
    """A learned gate on a layer's attention outputs before the output projection: the layer's
    projection ``gate`` (d_model -> :meth:`width`, no bias) of the same normed input its q, k and
    v project from, whose softplus (in float32, rounded to the outputs' dtype, as Laguna computes
    it) scales one head (``per_head``) or one channel of every head."""

    name: str
    per_head: bool

    def width(self, heads: int, head_dim: int) -> int:
        """Gate values per position of a layer of ``heads`` heads of ``head_dim`` channels."""
        return heads if self.per_head else heads * head_dim

    def params(self, spec: ModelSpec, shape: LayerShape) -> int:
        """Parameters of a layer's gate projection."""
        return spec.d_model * self.width(shape.heads, shape.head_dim)

    def apply(self, logits: Tensor, y: Tensor) -> Tensor:
        """The attention outputs ``y`` [B, T, heads, head_dim] scaled by the gate of ``logits``
        [B, T, width] (the gate projection of the layer's input at the same positions)."""
        import torch.nn.functional as F

        gate = F.softplus(logits.float()).to(y.dtype)
        return y * (gate.unsqueeze(-1) if self.per_head else gate.view(y.shape))


#: ``output_gate``: ``softplus_head``, one gate per head (Laguna's ``gating = true`` / ``"per-head"``);
#: ``softplus_element``, one per channel (``"per-element"``)
OUTPUT_GATES = {g.name: g for g in (OutputGate("softplus_head", per_head=True),
                                    OutputGate("softplus_element", per_head=False))}
