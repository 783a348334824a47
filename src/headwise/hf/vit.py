"""``ViTForImageClassification`` as an :class:`~headwise.hf.convert.Architecture`.

The two models compute the same function: a convolutional patch embedding, a class token put
first, learned positions, pre-LayerNorm blocks with 1/sqrt(head_dim) bidirectional attention
(biased output projection and MLP; q/k/v biased when ``qkv_bias``), a final LayerNorm and a
linear classifier of the class token's final state. Hugging Face keeps the positions as one
``[1, T, d]`` parameter instead of an ``nn.Embedding``.

A head width decoupled from ``d_model / heads`` is expressed through ``ViTConfig.head_dim``, an
attribute ``ViTAttention`` reads when the config has it (so Leaner's 16 heads of 64 at d 768
convert); per-layer head counts or widths are not expressible.

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import Architecture, Layout, activation_of, block_pairs, hidden_act, one_kv_per_head
from headwise.model.features import ACTIVATIONS
from headwise.spec import ModelSpec


def _write(spec: ModelSpec) -> dict[str, Any]:
    shape = spec.layer(0)
    # read by ViTAttention: getattr(config, "head_dim", d // heads)
    extra = {"head_dim": shape.head_dim} if shape.head_dim * shape.heads != spec.d_model else {}
    return dict(
        hidden_size=spec.d_model, num_hidden_layers=spec.n_layers, num_attention_heads=shape.heads,
        intermediate_size=shape.mlp_hidden, hidden_act=ACTIVATIONS[spec.activation].hidden_act,
        hidden_dropout_prob=spec.dropout, attention_probs_dropout_prob=spec.dropout, initializer_range=spec.init_std,
        layer_norm_eps=spec.layer_norm_eps, image_size=spec.image_size, patch_size=spec.patch_size,
        num_channels=spec.channels, qkv_bias=spec.qkv_bias, num_labels=spec.num_classes, **extra,
    )


def _square(config: Any, name: str) -> int:
    """An int ``image_size`` / ``patch_size`` of a config (a square pair is accepted)."""
    value = getattr(config, name)
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise HeadwiseError(f"cannot convert from ViT: {name} = {list(value)} is not square; headwise's images are")
        value = value[0]
    return int(value)


def _read(config: Any) -> dict[str, Any]:
    activation = activation_of(config.hidden_act, "ViT")
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
    return dict(
        d_model=d, n_layers=config.num_hidden_layers, heads=[heads] * config.num_hidden_layers, head_dim=head_dim,
        **mlp, activation=activation, layer_norm_eps=config.layer_norm_eps, dropout=config.hidden_dropout_prob,
        qkv_bias=bool(config.qkv_bias), init_std=config.initializer_range, image_size=_square(config, "image_size"),
        patch_size=_square(config, "patch_size"), channels=config.num_channels, num_classes=config.num_labels,
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


VIT = Architecture(
    "vit", "vit", "ViT", "ViTForImageClassification", "images", "classes",
    # the images front end derives vocab_size (none) and max_seq_len (the patches and the class token)
    maps=frozenset({"vocab_size", "max_seq_len", "d_model", "n_layers", "heads", "kv_heads", "head_dim",
                    "mlp_hidden", "mlp_ratio", "activation", "attention", "layer_norm_eps", "dropout", "qkv_bias",
                    "init_std", "image_size", "patch_size", "channels", "num_classes"}),
    fixed=(("causal", False, "ViT attends both ways"),
           ("score_scale", "inv_sqrt", "ViT scales attention scores by 1/sqrt(head_dim)"),
           ("norm", "layernorm_pre", "ViT uses pre-norm LayerNorm"),
           ("positions", "learned", "ViT has learned absolute positions"),
           ("pooling", "cls", "transformers' ViTForImageClassification classifies the class token only (no mean "
                              "pooling)"),
           ("out_bias", True, "ViT's attention output projection has a bias"),
           ("mlp_bias", True, "ViT's MLP has biases"),
           ("classifier_hidden", None, "ViT's classifier is one linear map"),
           ("embedding_norm", None, "ViT has no LayerNorm on its embeddings"),
           ("qk_norm", None, "ViT does not normalise q and k"),
           ("output_gate", None, "ViT has no gate on the attention outputs")),
    write=_write, read=_read,
    uniform=(("heads", "num_attention_heads"), ("head_dim", "head width"), ("mlp_hidden", "intermediate_size")),
    rules=(lambda spec: one_kv_per_head(spec, "ViT"), lambda spec: hidden_act(spec, "ViT")),
    layout=Layout(_pairs, lambda i, part: [f"vit.layers.{i}.attention.{p}_proj.{part}" for p in "qkv"]),
)
