"""Conversion to and from Apple's OpenELM (corenet's ``general_gpt`` and the hub's
``OpenELMForCausalLM`` remote code), for the Llama-style specs it can express.

OpenELM is a Llama-style decoder whose layers differ (layer-wise scaling,
:func:`headwise.plans.layerwise_scaling`): every layer has its own query heads, key/value heads and
FFN width, all heads of one width. Its blocks are pre-RMSNorm, RoPE, 1/sqrt(head_dim) scores, a
SwiGLU FFN, no biases, and one eps for every norm; q and k are RMS-normed (one weight over head_dim
per layer) where ``normalize_qk_projections`` says; the output layer is the token embedding
(``share_input_output_layers``) or a bias-free map. A field a config leaves out takes corenet's
default (``GPTConfig``): untied, no q/k norms. OpenELM's code (corenet's ``GPTConfig`` and the hub's
``OpenELMConfig``) computes every layer's heads from ``qkv_multipliers`` and ``num_gqa_groups``,
whatever per-layer ``num_query_heads`` a ``config.json`` lists (the hub saves its own result there):
a config is read that way, and written with the multipliers that give the spec's heads.

The weights map one to one. OpenELM's ``qkv_proj`` is laid out as headwise's fused ``qkv``: the
query heads, then the key heads, then the value heads, each head's rows together. Its ``proj_1``
holds the FFN's gate first and its value second (``act(y_1) * y_2``), headwise's ``mlp.fc`` the
value first (``swiglu`` in :data:`headwise.model.features.ACTIVATIONS`): the two halves swap.

No ``transformers`` class is involved: OpenELM is remote code, so this module reads and writes
state dicts under the hub's names (``transformer.layers.{i}.attn.qkv_proj.weight``, ...; an untied
output layer ``lm_head.weight``) or corenet's (``prefix=""``: the same names without
``transformer.``; the output layer ``classifier.weight``), and the hub's ``config.json`` fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from headwise.errors import HeadwiseError
from headwise.hf.convert import Architecture
from headwise.model.transformer import Transformer
from headwise.plans import layerwise_scaling, make_divisible
from headwise.spec import ModelSpec


def _two_widths(spec: ModelSpec) -> str | None:
    if spec.n_layers == 2 and len({s.mlp_hidden for s in spec.layers()}) == 2:
        return ("a 2-layer model with two FFN widths; OpenELM reads two ffn_multipliers as the ends of a ramp "
                "rounded to 2 decimals")
    return None


def _query_heads(n: int, d: int, head_dim: int, qkv: Any, groups: int) -> list[int]:
    """Each layer's query heads as OpenELM computes them from ``qkv_multipliers`` (corenet's
    ``GPTConfig.__post_init__``, and the hub's ``OpenELMConfig``): two values by layer-wise scaling,
    one value for every layer as it is (unrounded: corenet rounds only a ramp's values)."""
    if isinstance(qkv, (list, tuple)):
        if len(qkv) != 2:
            raise HeadwiseError(f"cannot convert: qkv_multipliers has {len(qkv)} values; OpenELM takes one, or two "
                                "(the first and last layers')")
        return list(layerwise_scaling(n, d, head_dim, qkv_multipliers=tuple(qkv), gqa_groups=groups).heads)
    return [make_divisible(d * qkv, head_dim * groups) // head_dim] * n


def _qkv_multipliers(spec: ModelSpec) -> tuple[float | list[float], int] | None:
    """``qkv_multipliers`` and ``num_gqa_groups`` from which OpenELM computes ``spec``'s query and
    key/value heads (its code ignores a config's own head lists), or None where none do: one
    multiplier for equal layers, else the first pair of 2-decimal ends (the first and last
    layers' heads bound them) whose ramp gives every layer's heads."""
    layers = spec.layers()
    heads, kv = [s.heads for s in layers], [s.kv_heads for s in layers]
    if any(h % k for h, k in zip(heads, kv)) or len({h // k for h, k in zip(heads, kv)}) != 1:
        return None
    groups, head_dim, n, d = heads[0] // kv[0], layers[0].head_dim, spec.n_layers, spec.d_model
    if len(set(heads)) == 1:
        return heads[0] * head_dim / d, groups
    top = math.ceil(100 * (max(heads) + groups) * head_dim / d) + 1
    ends = [[k / 100 for k in range(1, top) if _query_heads(1, d, head_dim, k / 100, groups) == [h]]
            for h in (heads[0], heads[-1])]
    for first in ends[0]:
        for last in ends[1]:
            if _query_heads(n, d, head_dim, [first, last], groups) == heads:
                return [first, last], groups
    return None


def _heads_ramp(spec: ModelSpec) -> str | None:
    if _qkv_multipliers(spec) is None:
        return (f"query heads {list(spec.heads)} over key/value heads {spec.kv_heads_per_layer}: OpenELM computes "
                "every layer's heads from qkv_multipliers (one value, or a ramp of two rounded to 2 decimals) in "
                "num_gqa_groups equal groups, and none give these")
    return None


def _write(spec: ModelSpec) -> dict[str, Any]:
    """The hub ``config.json`` fields: ``qkv_multipliers`` and ``num_gqa_groups`` that give the
    heads (OpenELM's code computes them; the per-layer lists beside them are what the hub saves),
    FFN multipliers one per layer, or one for equal layers (a hub config's two values would be a
    rounded ramp); ``ffn_dim_divisor`` 1 keeps every FFN width exact."""
    layers = spec.layers()
    qkv, groups = _qkv_multipliers(spec)
    ffn = [s.mlp_hidden / 2 / spec.d_model for s in layers]
    return {
        "model_type": "openelm", "vocab_size": spec.vocab_size, "max_context_length": spec.max_seq_len,
        "num_transformer_layers": spec.n_layers, "model_dim": spec.d_model, "head_dim": layers[0].head_dim,
        "qkv_multipliers": qkv, "num_gqa_groups": groups,
        "num_query_heads": [s.heads for s in layers], "num_kv_heads": [s.kv_heads for s in layers],
        "ffn_multipliers": ffn[0] if len(set(ffn)) == 1 else ffn, "ffn_dim_divisor": 1,
        "ffn_with_glu": True, "activation_fn_name": "swish", "normalization_layer_name": "rms_norm",
        "normalize_qk_projections": spec.qk_norm is not None, "share_input_output_layers": spec.tie_embeddings,
        "rope_freq_constant": spec.rope_theta, "rope_max_length": 2 * spec.max_seq_len,
        "initializer_range": spec.init_std, "rms_norm_eps": spec.layer_norm_eps,
    }


def _per_layer(value: Any, n_layers: int, name: str) -> list[Any]:
    """A per-layer list from a config field that is one value or a list with one per layer."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n_layers
    if len(values) != n_layers:
        raise HeadwiseError(f"cannot convert: {name} has {len(values)} values for {n_layers} layers")
    return values


def _read(config: Mapping[str, Any]) -> dict[str, Any]:
    """The spec fields of an OpenELM config (the hub's ``config.json`` fields, or corenet's
    ``GPTConfig`` fields as a dict; an absent field takes ``GPTConfig``'s default). The heads are
    computed from ``qkv_multipliers`` as OpenELM's code computes them (:func:`_query_heads`); the
    per-layer ``num_query_heads`` and ``num_kv_heads`` a hub config also lists must agree. FFN
    widths are rounded from ``ffn_multipliers`` (two values: the ends of a ramp; else one per
    layer, or one for all) by ``make_divisible(m * model_dim, ffn_dim_divisor)`` as OpenELM's FFN does."""
    get = config.get
    if not get("ffn_with_glu", True) or get("activation_fn_name", "swish") not in ("swish", "silu"):
        raise HeadwiseError("cannot convert: headwise's OpenELM FFN is SwiGLU (ffn_with_glu, swish)")
    if get("normalization_layer_name", "rms_norm") != "rms_norm":
        raise HeadwiseError(f"cannot convert: normalization_layer_name = {get('normalization_layer_name')!r}; "
                            "headwise reads OpenELM's rms_norm")
    n, d, head_dim = int(config["num_transformer_layers"]), int(config["model_dim"]), int(config["head_dim"])
    groups, divisor = int(get("num_gqa_groups") or 1), int(get("ffn_dim_divisor", 256))
    heads = _query_heads(n, d, head_dim, get("qkv_multipliers", 1.0), groups)
    kv_heads = [h // groups for h in heads]
    for name, computed in (("num_query_heads", heads), ("num_kv_heads", kv_heads)):
        listed = get(name)
        if isinstance(listed, (list, tuple)) and list(listed) != computed:
            raise HeadwiseError(f"cannot convert: {name} {list(listed)} differ from the {computed} that OpenELM "
                                f"computes from qkv_multipliers {get('qkv_multipliers', 1.0)} (its code uses these)")
    ffn = get("ffn_multipliers", 4.0)
    if isinstance(ffn, (list, tuple)) and len(ffn) == 2:
        # two values are the first and last layers' (corenet's rule), ramped as OpenELM ramps them
        mlp = list(layerwise_scaling(n, d, head_dim, ffn_multipliers=tuple(ffn), ffn_divisor=divisor).mlp_hidden)
    else:
        mlp = [2 * int(make_divisible(m * d, divisor)) for m in _per_layer(ffn, n, "ffn_multipliers")]
    return dict(
        vocab_size=int(config["vocab_size"]), d_model=d, n_layers=n, max_seq_len=int(get("max_context_length", 2048)),
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, mlp_hidden=mlp,
        layer_norm_eps=float(get("rms_norm_eps", 1e-6)), rope_theta=float(get("rope_freq_constant", 10000)),
        tie_embeddings=bool(get("share_input_output_layers", False)), init_std=float(get("initializer_range", 0.02)),
        qk_norm="rmsnorm" if get("normalize_qk_projections", False) else None,
    )


OPENELM = Architecture(
    "openelm", "openelm", "OpenELM", None, "tokens", "lm",
    maps=frozenset({"vocab_size", "d_model", "n_layers", "max_seq_len", "heads", "kv_heads", "head_dim", "mlp_hidden",
                    "mlp_ratio", "attention", "layer_norm_eps", "rope_theta", "tie_embeddings", "init_std",
                    "qk_norm"}),
    fixed=(("causal", True, "it is a decoder"),
           ("norm", "rmsnorm_pre", "its blocks are pre-norm RMSNorm"),
           ("positions", "rope", "it has rotary positions"),
           ("partial_rotary_factor", 1.0, "its RoPE rotates every channel of a head"),
           ("activation", "swiglu", "its FFN is SwiGLU (ffn_with_glu, swish)"),
           ("score_scale", "inv_sqrt", "it scales attention scores by 1/sqrt(head_dim)"),
           ("qkv_bias", False, "its projections have no biases"),
           ("out_bias", False, "its projections have no biases"),
           ("mlp_bias", False, "its FFN has no biases"),
           ("embedding_norm", None, "it has no norm on its embeddings"),
           ("dropout", 0.0, "it has no dropout"),
           ("drop_path", None, "it has no stochastic depth"),
           ("output_gate", None, "it has no gate on the attention outputs")),
    write=_write, read=_read, uniform=(("head_dim", "head_dim"),), rules=(_two_widths, _heads_ramp),
)


def _names(spec: ModelSpec, prefix: str) -> list[tuple[str, str]]:
    """(headwise key, OpenELM key) of every weight; the FFN's ``mlp.fc`` / ``proj_1`` swap halves.
    An untied output layer is corenet's ``classifier``; the hub's ``OpenELMForCausalLM`` keeps it
    as ``lm_head``, beside its ``transformer`` (whose own ``classifier`` the hub never uses)."""
    pairs = [("tok_emb.weight", f"{prefix}token_embeddings.weight"), ("norm_f.weight", f"{prefix}norm.weight")]
    qk_norms = ("attn.q_norm.weight", "attn.k_norm.weight") if spec.qk_norm is not None else ()
    for i in range(spec.n_layers):
        ours, theirs = f"blocks.{i}.", f"{prefix}layers.{i}."
        pairs += [(ours + a, theirs + b) for a, b in (
            ("norm1.weight", "attn_norm.weight"), ("norm2.weight", "ffn_norm.weight"),
            ("attn.qkv.weight", "attn.qkv_proj.weight"), ("attn.out.weight", "attn.out_proj.weight"),
            *((name, name) for name in qk_norms),
            ("mlp.fc.weight", "ffn.proj_1.weight"), ("mlp.proj.weight", "ffn.proj_2.weight"))]
    if not spec.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight" if prefix else "classifier.weight"))
    return pairs


def _swap_halves(w: Tensor) -> Tensor:
    """The two halves of ``w`` along its first dimension, the second first."""
    first, second = w.chunk(2, dim=0)
    return torch.cat([second, first])


@torch.no_grad()
def to_state_dict(model: Transformer, prefix: str = "transformer.") -> dict[str, Tensor]:
    """OpenELM's state dict (the hub's names; ``prefix=""`` for corenet's) with exactly ``model``'s
    weights; the tied output layer is not repeated."""
    OPENELM.check(model.spec)
    ours = model.state_dict()
    return {theirs: (_swap_halves(ours[a]) if a.endswith("mlp.fc.weight") else ours[a]).clone()
            for a, theirs in _names(model.spec, prefix)}


@torch.no_grad()
def from_state_dict(state: Mapping[str, Tensor], spec: ModelSpec, prefix: str = "transformer.") -> Transformer:
    """A headwise Transformer of ``spec`` (in eval mode) with exactly the weights of OpenELM's state
    dict ``state``; a missing or misshapen weight is a HeadwiseError naming it."""
    OPENELM.check(spec)
    model = Transformer(spec).eval()
    ours = model.state_dict()
    for a, theirs in _names(spec, prefix):
        if theirs not in state:
            raise HeadwiseError(f"cannot convert: the OpenELM state dict has no {theirs!r}")
        w = state[theirs]
        if tuple(w.shape) != tuple(ours[a].shape):
            raise HeadwiseError(f"cannot convert: {theirs} is {list(w.shape)}; the spec needs {list(ours[a].shape)}")
        ours[a].copy_(_swap_halves(w) if a.endswith("mlp.fc.weight") else w)
    return model


def from_openelm(reference: torch.nn.Module, config: Mapping[str, Any], prefix: str = "transformer.") -> Transformer:
    """A headwise Transformer with exactly the weights of an OpenELM module (the hub's
    ``OpenELMForCausalLM``, or corenet's model with ``prefix=""``) of config ``config``."""
    return from_state_dict(reference.state_dict(), OPENELM.spec_from_config(config), prefix)
