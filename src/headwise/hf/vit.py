"""Conversion to and from Hugging Face ``ViTForImageClassification`` for image specs ViT can express.

The two models compute the same function: a convolutional patch embedding, a class token put
first, learned positions, pre-LayerNorm blocks with 1/sqrt(head_dim) bidirectional attention
(biased output projection and MLP; q/k/v biased when ``qkv_bias``), a final LayerNorm and a
linear classifier of the class token's final state. The layouts differ only in where weights
live: headwise fuses q, k and v into one ``[3 * width, d]`` projection, Hugging Face keeps three,
and its positions are one ``[1, T, d]`` parameter instead of an ``nn.Embedding``.

A head width decoupled from ``d_model / heads`` is expressed through ``ViTConfig.head_dim``, an
attribute ``ViTAttention`` reads when the config has it (so Leaner's 16 heads of 64 at d 768
convert); per-layer head counts or widths are not expressible.

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import (
    Layout, block_pairs, check_expressible, fixed_field_problem, from_architecture, kind_problem, to_architecture,
)
from headwise.model.features import ACTIVATIONS
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec

# What ViT's architecture fixes, as (spec field, required value, why)
_VIT_FIXED = [
    ("causal", False, "ViT attends both ways"),
    ("score_scale", "inv_sqrt", "ViT scales attention scores by 1/sqrt(head_dim)"),
    ("norm", "layernorm_pre", "ViT uses pre-norm LayerNorm"),
    ("positions", "learned", "ViT has learned absolute positions"),
    ("pooling", "cls", "transformers' ViTForImageClassification classifies the class token only (no mean pooling)"),
    ("out_bias", True, "ViT's attention output projection has a bias"),
    ("mlp_bias", True, "ViT's MLP has biases"),
    ("classifier_hidden", None, "ViT's classifier is one linear map"),
    ("embedding_norm", None, "ViT has no LayerNorm on its embeddings"),
    ("qk_norm", None, "ViT does not normalise q and k"),
    ("output_gate", None, "ViT has no gate on the attention outputs"),
]
#: the ``hidden_act`` names (transformers' ACT2FN) of headwise's activations that have one
_ACTIVATIONS = {a.hidden_act: name for name, a in ACTIVATIONS.items() if a.hidden_act is not None}


def vit_incompatibility(spec: ModelSpec) -> str | None:
    """Why ``ViTForImageClassification`` cannot express ``spec``, or None when it can."""
    if spec.inputs != "images":
        return f"inputs = {spec.inputs!r}: ViT reads images"
    if spec.output_head != "classes":
        return f"outputs = {spec.output_head!r}: ViTForImageClassification ends in a classifier"
    if len(set(spec.heads)) != 1:
        return f"its layers have different head counts {spec.heads}; ViT has one num_attention_heads for all layers"
    if len(set(spec.head_dims)) != 1:
        return f"its layers have different head widths {spec.head_dims}; ViT has one head width for all layers"
    if spec.kv_heads_per_layer != spec.heads:
        return f"it has {spec.kv_heads_per_layer} key/value heads per layer; ViT has one per query head"
    hidden = {s.mlp_hidden for s in spec.layers()}
    if len(hidden) != 1:
        return f"its layers have different MLP widths {sorted(hidden)}; ViT has one intermediate_size"
    kinds = kind_problem(spec, "vit", "ViT")
    if kinds:
        return kinds
    fixed = fixed_field_problem(spec, _VIT_FIXED)
    if fixed:
        return fixed
    if ACTIVATIONS[spec.activation].hidden_act is None:
        return f"activation = {spec.activation!r} has no transformers hidden_act"
    return None


def to_vit_config(spec: ModelSpec) -> Any:
    """The ``ViTConfig`` equal to ``spec``; a HeadwiseError if ViT cannot express it."""
    from transformers import ViTConfig

    check_expressible(spec, vit_incompatibility, "ViT")
    shape = spec.layer(0)
    extra = {}
    if shape.head_dim * shape.heads != spec.d_model:
        extra["head_dim"] = shape.head_dim  # read by ViTAttention: getattr(config, "head_dim", d // heads)
    return ViTConfig(
        hidden_size=spec.d_model,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.mlp_hidden,
        hidden_act=ACTIVATIONS[spec.activation].hidden_act,
        hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.dropout,
        initializer_range=spec.init_std,
        layer_norm_eps=spec.layer_norm_eps,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        num_channels=spec.channels,
        qkv_bias=spec.qkv_bias,
        num_labels=spec.num_classes,
        **extra,
    )


def _square(config: Any, name: str) -> int:
    """An int ``image_size`` / ``patch_size`` of a config (a square pair is accepted)."""
    value = getattr(config, name)
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise HeadwiseError(f"cannot convert from ViT: {name} = {list(value)} is not square; headwise's images are")
        value = value[0]
    return int(value)


def spec_from_vit_config(config: Any) -> ModelSpec:
    """The ModelSpec of a ``ViTConfig`` (of a ``ViTForImageClassification``)."""
    act = config.hidden_act
    if act not in _ACTIVATIONS:
        raise HeadwiseError(f"cannot convert from ViT: hidden_act = {act!r}; headwise has "
                            f"{', '.join(sorted(_ACTIVATIONS.values()))}")
    if config.hidden_dropout_prob != config.attention_probs_dropout_prob:
        raise HeadwiseError(
            f"cannot convert from ViT: hidden_dropout_prob {config.hidden_dropout_prob} differs from "
            f"attention_probs_dropout_prob {config.attention_probs_dropout_prob}; headwise has one dropout")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim * heads == config.hidden_size:
        head_dim = None  # the standard tie
    # The MLP width as a ratio of d_model when it is a multiple of d_model / 4 (as the presets
    # give it), else as a width
    d, hidden = config.hidden_size, config.intermediate_size
    mlp = dict(mlp_ratio=hidden / d) if (4 * hidden) % d == 0 else dict(mlp_hidden=hidden)
    return ModelSpec(
        inputs="images",
        d_model=config.hidden_size,
        n_layers=config.num_hidden_layers,
        heads=[heads] * config.num_hidden_layers,
        head_dim=head_dim,
        **mlp,
        activation=_ACTIVATIONS[act],
        causal=False,
        score_scale="inv_sqrt",
        norm="layernorm_pre",
        layer_norm_eps=config.layer_norm_eps,
        positions="learned",
        dropout=config.hidden_dropout_prob,
        qkv_bias=bool(config.qkv_bias),
        init_std=config.initializer_range,
        image_size=_square(config, "image_size"),
        patch_size=_square(config, "patch_size"),
        channels=config.num_channels,
        num_classes=config.num_labels,
        pooling="cls",
    )


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """(headwise name, ViT name) pairs for everything but the fused q/k/v."""
    return [("cls_token.weight", "vit.embeddings.cls_token"),
            ("patch_emb.weight", "vit.embeddings.patch_embeddings.projection.weight"),
            ("patch_emb.bias", "vit.embeddings.patch_embeddings.projection.bias"),
            ("pos_emb.weight", "vit.embeddings.position_embeddings"),
            ("norm_f.weight", "vit.layernorm.weight"), ("norm_f.bias", "vit.layernorm.bias"),
            ("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias"),
            *block_pairs(spec.n_layers, "vit.layers.", [("norm1", "layernorm_before"), ("norm2", "layernorm_after"),
                                                        ("attn.out", "attention.o_proj"), ("mlp.fc", "mlp.fc1"),
                                                        ("mlp.proj", "mlp.fc2")])]


#: where ViT keeps headwise's weights
LAYOUT = Layout(_pairs, lambda i, part: [f"vit.layers.{i}.attention.{p}_proj.{part}" for p in "qkv"])


def to_hf_vit(model: Transformer, attn_implementation: str = "sdpa") -> Any:
    """A ``ViTForImageClassification`` with exactly ``model``'s weights (in eval mode), running
    ``attn_implementation`` ("sdpa", transformers' default on CPU, or "eager")."""
    from transformers import ViTForImageClassification

    hf = ViTForImageClassification(to_vit_config(model.spec))
    hf.set_attn_implementation(attn_implementation)
    return to_architecture(model, hf, LAYOUT)


def from_hf_vit(hf: Any) -> Transformer:
    """A headwise Transformer (in eval mode) with exactly a ``ViTForImageClassification``'s weights."""
    spec = spec_from_vit_config(hf.config)
    reason = vit_incompatibility(spec)
    if reason:  # a config spec_from_vit_config accepts is expressible; kept as a guard
        raise HeadwiseError(f"cannot convert from ViT: {reason}")
    return from_architecture(hf, spec, LAYOUT)
