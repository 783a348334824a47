"""Attention kinds: what one attention layer computes from its q, k and v, as plug-ins.
``ModelSpec.attention`` names a kind per layer; a kind is one module that registers an
:class:`AttentionKind` subclass with :func:`register_kind` and declares all there is to layers of
its kind:

- ``options``: its settings (:class:`Option`), flat fields of ``ModelSpec`` (keys of ``[model]``)
  that every layer of the kind reads, and :meth:`~AttentionKind.check` for what a spec must meet;
- :meth:`~AttentionKind.params` and :meth:`~AttentionKind.flops`: its exact parameter count and
  training FLOPs beyond the q, k, v and output projections every layer has (:mod:`headwise.params`);
- :meth:`~AttentionKind.build` and :meth:`~AttentionKind.forward`: what it adds to the layer and
  the layer's attention outputs, with the key/value cache contract where it is causal;
- ``reorderable``: whether a bidirectional layer of the kind ignores the order of its positions;
- :meth:`~AttentionKind.allowed_keys` and :meth:`~AttentionKind.label`: how analysis reads it,
  :meth:`~AttentionKind.describe`: how a model card names it;
- ``hf_names`` and ``hf_config``: what a Hugging Face architecture calls it, where one has it.

The built-in kinds are this package's ``attention_*`` modules (``global``, ``local``,
``nystrom``), found by listing the folder when :mod:`headwise.spec` loads; their options become
``ModelSpec`` fields then. A family registers its own kind from its folder's model modules (those
:data:`headwise.parts.FAMILY_MODULES` names, ``families/<name>/model*.py``), found when a spec
first names a kind no loaded module registered; such a kind reads the fields there are and
declares no options of its own.

This module and the kind modules load no torch at import (their functions import what runs the
model), so :mod:`headwise.spec` reads the options without torch; they import only the standard
library, torch and each other, so an exported model carries them (:mod:`headwise.hf.export`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from headwise.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor, device, nn

    from headwise.model.cache import LayerCache
    from headwise.spec import LayerShape, ModelSpec


@dataclass(frozen=True)
class Option:
    """One setting of an attention kind: a ``ModelSpec`` field of that name, one value for every
    layer of the kind. ``type``: its annotation (``int``, ``int | None``, a ``Literal``);
    ``gt``: a bound it must exceed, where it has one."""

    type: Any
    default: Any
    doc: str
    gt: int | None = None


class AttentionKind:
    """One kind of attention layer. Kinds are stateless classes; the layer is
    :class:`headwise.model.transformer.Attention`, which holds for every kind the fused ``qkv``
    and the ``out`` projection, ``heads``, ``kv_heads``, ``head_dim``, ``width``, ``causal``,
    ``scale`` and ``dropout``, and whatever :meth:`build` adds. The layer splits its projection into
    q [B, heads, T, head_dim] and k, v [B, kv_heads, T, head_dim] and applies its q/k norms and
    RoPE before the kind sees them. The defaults are
    softmax attention over every key a position may see: the ``global`` kind is this class
    unchanged."""

    #: the name ``ModelSpec.attention`` gives layers of this kind
    name: ClassVar[str]
    #: its settings, by ``ModelSpec`` field name
    options: ClassVar[dict[str, Option]] = {}
    #: whether this is the kind of every layer of a spec that names none
    default: ClassVar[bool] = False
    #: whether a bidirectional layer's output at a position is the same for any order of the
    #: other positions (a masked LM's last block then computes only its masked positions, see
    #: :func:`headwise.model.transformer.selected_first`)
    reorderable: ClassVar[bool] = False
    #: Hugging Face architecture (``"gpt_neo"``, ``"vit"``) -> its name for this kind
    hf_names: ClassVar[dict[str, str]] = {}
    #: Hugging Face architecture -> {its config field: the option it holds}
    hf_config: ClassVar[dict[str, dict[str, str]]] = {}

    @staticmethod
    def check(spec: ModelSpec, used: bool) -> None:
        """Raise ValueError, saying what to change, for settings of ``spec`` this kind refuses:
        its options' in any spec, and, where ``used`` (a layer is of this kind), what such a layer
        needs. By default: nothing."""

    @staticmethod
    def params(spec: ModelSpec, shape: LayerShape) -> int:
        """Parameters of a layer of this kind beyond its q, k, v and output projections (those of
        the modules :meth:`build` adds). By default: none."""
        return 0

    @staticmethod
    def flops(spec: ModelSpec, shape: LayerShape, t: int) -> float:
        """Training FLOPs (forward and backward: 6 per multiply-add) of the layer's attention
        products over ``t`` positions, beyond its projections. By default softmax attention's:
        q k^T and the weighted sum of v, 2 t^2 width multiply-adds."""
        return 6 * 2 * t * t * shape.width

    @staticmethod
    def build(attn: nn.Module, spec: ModelSpec, shape: LayerShape) -> None:
        """Set what the kind needs on the layer ``attn``: its settings, and its modules (which are
        then state-dict keys under ``attn``: name them once). By default: nothing."""

    @staticmethod
    def forward(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None, queries: int | None,
                key_mask: Tensor | None) -> Tensor:
        """The attention outputs [B, heads, T', head_dim] of q [B, heads, T, head_dim] and k, v
        [B, kv_heads, T, head_dim] (q and k already normed and rotated by the layer; each KV head
        serves ``heads / kv_heads`` consecutive query heads), before the output projection, with
        ``attn.dropout`` on the weights in training.

        ``queries``: the outputs of the first this many positions only (T' = queries), each still
        attending to every key; ``key_mask`` [B, T]: keys where it is False (padding) get no
        weight. Both come only to bidirectional layers without a cache.

        The key/value cache contract (causal layers, incremental decoding): ``cache`` is the
        layer's :class:`~headwise.model.cache.LayerCache` (or a view of a ``transformers`` cache
        with the same ``length`` and ``extend``); the layer appends its new keys and values (its
        KV heads, rotated) with ``cache.extend(k, v)`` and the new positions, which follow the ``cache.length`` cached
        ones, attend to the cached keys too. A fresh cache (``length`` 0) must give exactly what
        no cache gives. Bidirectional layers get no cache.

        By default, softmax attention (:func:`softmax_attention`)."""
        return softmax_attention(attn, q, k, v, cache, queries, key_mask)

    @staticmethod
    def allowed_keys(attn: nn.Module, t: int, device: device) -> Tensor | None:
        """For analysis, the keys each of ``t`` fresh positions' softmax attention may weigh,
        [t, t] bool (query, key), or None for every key: the softmax attention the layer computes,
        or that it approximates. By default: the causal mask of a causal layer."""
        from headwise.model.kernels import attention_mask

        return attention_mask(0, t, None, device) if attn.causal else None

    @classmethod
    def label(cls, attn: nn.Module) -> str:
        """The layer's kind as analysis reports it (``LayerStats.attention``). By default its name."""
        return cls.name

    @classmethod
    def describe(cls, spec: ModelSpec) -> str:
        """A layer of this kind in a model card's table of layers. By default its name."""
        return cls.name


def softmax_attention(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None,
                      queries: int | None, key_mask: Tensor | None, window: int | None = None) -> Tensor:
    """Softmax attention of the layer ``attn`` through one fused SDPA call
    (:func:`headwise.model.kernels.attention`): causal if the layer is, ``window``: each position
    sees itself and the ``window - 1`` positions before it."""
    from headwise.model.kernels import attention

    dropout = attn.dropout if attn.training else 0.0
    return attention(q, k, v, cache, attn.causal, window, attn.scale, dropout, queries, key_mask)


#: every registered attention kind, by name. The built-in ones (this folder's ``attention_*``
#: modules) register when :mod:`headwise.spec` loads, which lists them; a family's, when the spec
#: first meets a name they lack; an exported folder imports those its model uses.
ATTENTION_KINDS: Registry[type[AttentionKind]] = Registry("attention kind")


def register_kind(kind: type[AttentionKind]) -> type[AttentionKind]:
    """Register ``kind`` under its ``name`` (a class decorator); returns it."""
    return ATTENTION_KINDS.register(kind.name, kind)
