"""headwise's ViT as timm's ``VisionTransformer`` at the same weights, both ways.

Leaner Transformers trained its models with timm, so its ViT and headwise's must compute the
same function: a convolutional patch embedding, a class token put first (``global_pool="token"``)
or none and the mean of the patches (``"avg"`` with ``fc_norm=False``: timm's default for
``"avg"`` norms after pooling, headwise before), learned positions over every token, pre-LayerNorm
blocks with 1/sqrt(head_dim) attention, a final LayerNorm and a linear classifier. timm fuses q, k
and v as headwise does (q of every head, then k, then v), so every weight is copied as it is.

What a spec must have to be expressible is an :class:`~headwise.hf.convert.Architecture` record,
:data:`TIMM_VIT`, checked as the ``transformers`` conversions are; a held head width (Leaner's 16
heads of 64 at width 768) is timm's ``attn_head_dim``, through
:func:`~headwise.families.vision.timm_attention.held_width_attention`. A timm model is read from
its modules (timm keeps no config), refusing in one line what headwise has no counterpart for.
Dropout is refused both ways: timm's MLP also drops after its activation, headwise's does not.

Imports timm inside its functions only: this module is loaded by those who convert.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import nn

from headwise.errors import HeadwiseError
from headwise.hf.convert import Architecture, Layout, block_pairs, copy_weights, hidden_act, one_kv_per_head
from headwise.model.features import ACTIVATIONS
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec

LABEL = "timm's VisionTransformer"
#: headwise's pooling -> timm's ``global_pool``
GLOBAL_POOL = {"cls": "token", "mean": "avg"}
#: headwise's ungated activations -> the torch module (and its arguments) timm's MLP builds
ACT_LAYERS = {"gelu": (nn.GELU, {}), "gelu_new": (nn.GELU, {"approximate": "tanh"}), "relu": (nn.ReLU, {})}


def _mlp_ratio(hidden: int, d: int) -> float:
    """The ``mlp_ratio`` for which timm's ``int(d * mlp_ratio)`` is ``hidden``."""
    ratio = hidden / d
    # hidden / d * d can round just below hidden, which int() would floor a whole unit
    return ratio if int(d * ratio) == hidden else math.nextafter(ratio, math.inf)


def _write(spec: ModelSpec) -> dict[str, Any]:
    """``VisionTransformer``'s arguments for ``spec`` (one it can express)."""
    from timm.layers import LayerNorm

    shape = spec.layer(0)
    held = {}
    if shape.head_dim * shape.heads != spec.d_model:
        from headwise.families.vision.timm_attention import held_width_attention

        held = {"attn_layer": held_width_attention(shape.head_dim)}
    act, kwargs = ACT_LAYERS[spec.activation]
    return dict(
        img_size=spec.image_size, patch_size=spec.patch_size, in_chans=spec.channels, num_classes=spec.num_classes,
        global_pool=GLOBAL_POOL[spec.pooling], class_token=spec.pooling == "cls", fc_norm=False,
        embed_dim=spec.d_model, depth=spec.n_layers, num_heads=shape.heads,
        mlp_ratio=_mlp_ratio(shape.mlp_hidden, spec.d_model), qkv_bias=spec.qkv_bias,
        drop_path_rate=spec.drop_path or 0.0, norm_layer=partial(LayerNorm, eps=spec.layer_norm_eps),
        act_layer=partial(act, **kwargs), **held,
    )


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """(headwise name, timm name) of every weight but the fused q/k/v."""
    cls = [("cls_token.weight", "cls_token")] if spec.pooling == "cls" else []
    return [*cls, ("patch_emb.weight", "patch_embed.proj.weight"), ("patch_emb.bias", "patch_embed.proj.bias"),
            ("pos_emb.weight", "pos_embed"), ("norm_f.weight", "norm.weight"), ("norm_f.bias", "norm.bias"),
            ("classifier.weight", "head.weight"), ("classifier.bias", "head.bias"),
            *block_pairs(spec.n_layers, "blocks.", [("norm1", "norm1"), ("norm2", "norm2"), ("attn.out", "attn.proj"),
                                                    ("mlp.fc", "mlp.fc1"), ("mlp.proj", "mlp.fc2")])]


def _read(model: nn.Module) -> dict[str, Any]:
    """The spec fields (beyond :data:`TIMM_VIT`'s fixed ones) of a timm ViT."""
    if reason := _structure(model):
        raise HeadwiseError(f"cannot convert from {LABEL}: {reason}")
    block, d = model.blocks[0], model.embed_dim
    heads, head_dim, hidden = block.attn.num_heads, block.attn.head_dim, block.mlp.fc1.out_features
    # the MLP width as a ratio of d_model when it is a multiple of d_model / 4 (as the presets give it)
    mlp = dict(mlp_ratio=hidden / d) if (4 * hidden) % d == 0 else dict(mlp_hidden=hidden)
    patch = model.patch_embed
    return dict(
        d_model=d, n_layers=len(model.blocks), heads=[heads] * len(model.blocks),
        head_dim=None if heads * head_dim == d else head_dim, **mlp, activation=_activation(block.mlp.act),
        layer_norm_eps=model.norm.eps, qkv_bias=block.attn.qkv.bias is not None, drop_path=_drop_path(model),
        image_size=patch.img_size[0], patch_size=patch.patch_size[0], channels=patch.proj.in_channels,
        num_classes=model.head.out_features, pooling="cls" if model.global_pool == "token" else "mean",
    )


def _structure(model: nn.Module) -> str | None:
    """Why headwise cannot express timm model ``model`` (one line), or None when it can (its
    weights are checked when they are copied: :func:`_unmatched`)."""
    from timm.layers import Attention, LayerNorm, Mlp
    from timm.models.vision_transformer import Block, VisionTransformer

    if type(model) is not VisionTransformer:
        return f"{type(model).__name__} is not timm's VisionTransformer itself"
    if model.global_pool not in GLOBAL_POOL.values():
        return f"global_pool = {model.global_pool!r}: headwise pools the class token ('token') or the mean ('avg')"
    if model.global_pool == "avg" and model.num_prefix_tokens:
        return "global_pool = 'avg' with a class or register token: headwise's mean pooling has none"
    if model.has_class_token and model.no_embed_class:
        return "no_embed_class: headwise's class token has a position"
    if isinstance(model.norm, nn.Identity):
        return "fc_norm: timm norms after pooling, headwise before (build it with fc_norm=False)" \
            if not isinstance(model.fc_norm, nn.Identity) else "final_norm=False: headwise's blocks end in a LayerNorm"
    if model.pos_embed is None:
        return "it has no position embedding; headwise's ViT has learned positions"
    if not isinstance(model.head, nn.Linear):
        return "it has no classifier (num_classes = 0)"
    if len(set(model.patch_embed.img_size)) != 1 or len(set(model.patch_embed.patch_size)) != 1:
        return f"img_size {model.patch_embed.img_size} / patch_size {model.patch_embed.patch_size}: headwise's " \
               f"images and patches are square"
    for i, b in enumerate(model.blocks):
        if type(b) is not Block or type(b.mlp) is not Mlp or not isinstance(b.mlp.fc1, nn.Linear):
            return f"block {i} is {type(b).__name__} with {type(b.mlp).__name__}: headwise's is timm's Block with Mlp"
        if not isinstance(b.attn, Attention) or type(b.attn).forward is not Attention.forward:
            return f"block {i}'s attention is {type(b.attn).__name__}: headwise's is timm's Attention"
    norms = [model.norm, *(n for b in model.blocks for n in (b.norm1, b.norm2))]
    if len({m.eps for m in norms if hasattr(m, "eps")}) != 1 or any(type(m) not in (nn.LayerNorm, LayerNorm)
                                                                     for m in norms):
        return f"its norms are {sorted({(type(m).__name__, getattr(m, 'eps', None)) for m in norms})}: headwise's " \
               f"are LayerNorms of one eps"
    dropped = [(name, m.p) for name, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p]
    if dropped or not isinstance(model.patch_drop, nn.Identity):
        return f"dropout {dropped or 'of patches'}: headwise converts timm ViTs without dropout " \
               f"(timm's MLP also drops after its activation)"
    return None


def _activation(act: nn.Module) -> str:
    """headwise's name of the activation module ``act`` (timm builds several of each: nn.GELU, its
    own GELU, GELUTanh, ...; what they compute on a probe names them)."""
    probe = torch.linspace(-6, 6, 241)
    for name, activation in ACTIVATIONS.items():
        if not activation.gated and torch.equal(act(probe), activation(probe)):
            return name
    raise HeadwiseError(f"cannot convert from {LABEL}: activation {type(act).__name__} is none of headwise's "
                        f"({', '.join(n for n, a in ACTIVATIONS.items() if not a.gated)})")


def _drop_path(model: nn.Module) -> float | None:
    """The drop-path rate of the last block (None for none), when the blocks' rates are timm's
    linear rule from it (headwise's :func:`~headwise.model.transformer.drop_path_rates`)."""
    from timm.layers import calculate_drop_path_rates

    rates = [[getattr(m, "drop_prob", 0.0) for m in (b.drop_path1, b.drop_path2)] for b in model.blocks]
    if any(not getattr(m, "scale_by_keep", True) for b in model.blocks for m in (b.drop_path1, b.drop_path2)) \
            or rates != [[r, r] for r in calculate_drop_path_rates(rates[-1][0], len(rates))]:
        raise HeadwiseError(f"cannot convert from {LABEL}: drop-path rates {rates} are not timm's linear rule "
                            f"with kept samples scaled, as headwise's are")
    return _shortest_float32(rates[-1][0]) if rates[-1][0] else None


def _shortest_float32(value: float) -> float:
    """The shortest decimal that float32 rounds to ``value``: timm keeps its drop-path rates in
    float32 (``torch.linspace``), so 0.1 comes back as 0.10000000149011612."""
    # 9 significant digits always name a float32 exactly
    return next(short for short in (float(f"{value:.{n}g}") for n in range(1, 10))
                if torch.tensor(short, dtype=torch.float32).item() == value)


TIMM_VIT = Architecture(
    "timm-vit", "timm_vit", LABEL, None, "images", "classes",
    maps=frozenset({"vocab_size", "max_seq_len", "d_model", "n_layers", "heads", "kv_heads", "head_dim",
                    "mlp_hidden", "mlp_ratio", "activation", "attention", "layer_norm_eps", "qkv_bias", "drop_path",
                    "init_std", "image_size", "patch_size", "channels", "num_classes", "pooling"}),
    fixed=(("causal", False, "timm's ViT attends both ways"),
           ("score_scale", "inv_sqrt", "timm's ViT scales attention scores by 1/sqrt(head_dim)"),
           ("norm", "layernorm_pre", "timm's ViT uses pre-norm LayerNorm"),
           ("positions", "learned", "timm's ViT has learned absolute positions"),
           ("dropout", 0.0, "timm's MLP also drops after its activation, headwise's does not: only no dropout "
                            "computes the same"),
           ("out_bias", True, "timm's attention output projection has a bias (proj_bias)"),
           ("mlp_bias", True, "timm's MLP has biases (proj_bias)"),
           ("classifier_hidden", None, "timm's ViT classifier is one linear map"),
           ("embedding_norm", None, "timm's ViT has no LayerNorm on its embeddings"),
           ("qk_norm", None, "timm's qk_norm is a LayerNorm, headwise's an RMSNorm"),
           ("output_gate", None, "timm's ViT has no gate on the attention outputs")),
    write=_write, read=_read,
    uniform=(("heads", "num_heads"), ("head_dim", "attn_head_dim"), ("mlp_hidden", "mlp_ratio")),
    rules=(lambda spec: one_kv_per_head(spec, LABEL), lambda spec: hidden_act(spec, LABEL)),
    layout=Layout(_pairs, lambda i, part: [f"blocks.{i}.attn.qkv.{part}"]),
)


def to_timm(model: Transformer) -> nn.Module:
    """timm's ``VisionTransformer`` with exactly ``model``'s weights, in eval mode; a one-line
    HeadwiseError naming what of ``model.spec`` it cannot express."""
    from timm.models.vision_transformer import VisionTransformer

    theirs = VisionTransformer(**TIMM_VIT.to_config(model.spec)).eval()
    copy_weights(model, theirs, TIMM_VIT.layout, to_hf=True)
    return theirs


def from_timm(timm_model: nn.Module) -> Transformer:
    """A headwise Transformer (in eval mode) with exactly the weights of timm's ``VisionTransformer``
    ``timm_model``; a one-line HeadwiseError naming what headwise has no counterpart for."""
    model = Transformer(spec_from_timm(timm_model)).eval()
    if reason := _unmatched(model, timm_model):
        raise HeadwiseError(f"cannot convert from {LABEL}: {reason}")
    copy_weights(model, timm_model, TIMM_VIT.layout, to_hf=False)
    return model


def spec_from_timm(timm_model: nn.Module) -> ModelSpec:
    """The ModelSpec of timm's ``VisionTransformer`` ``timm_model``, read from its modules; a
    one-line HeadwiseError naming what headwise cannot express."""
    fixed = {f: v for f, v, _ in TIMM_VIT.fixed}
    return ModelSpec(**{**fixed, "inputs": "images", **TIMM_VIT.read(timm_model)})


def _unmatched(model: Transformer, timm_model: nn.Module) -> str | None:
    """Which weights of either model have no counterpart of the same size in the other, or None."""
    spec, ours, theirs = model.spec, model.state_dict(), timm_model.state_dict()
    pairs = TIMM_VIT.layout.pairs(spec) + [
        (f"blocks.{i}.attn.qkv.{part}", f"blocks.{i}.attn.qkv.{part}")
        for i in range(spec.n_layers) for part in (("weight", "bias") if spec.qkv_bias else ("weight",))]
    extra = sorted(set(theirs) - {b for _, b in pairs})
    if extra:
        return f"headwise has no place for its weights {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}"
    wrong = [b for a, b in pairs if b not in theirs or ours[a].numel() != theirs[b].numel()]
    return f"its weights {', '.join(wrong[:4])} are missing or of other sizes than headwise's" if wrong else None
