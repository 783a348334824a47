"""Conversion to and from Hugging Face ``LagunaForCausalLM`` (transformers 5.x, ``models/laguna``)
for the dense Llama-style specs it can express: per-layer query heads.

Laguna's block is Qwen3's (pre-RMSNorm, RMS-normed q and k per head before RoPE, grouped
key/value heads, 1/sqrt(head_dim) scores, SwiGLU) with three differences, each a headwise option:

- **per-layer query heads** (``num_attention_heads_per_layer``) over one ``num_key_value_heads``
  and one ``head_dim``: headwise's ``heads`` per layer, ``kv_heads`` uniform;
- **a softplus output gate** (``g_proj``, no bias, from the block's normed input) on the attention
  outputs before ``o_proj``, one per head (``gating = true`` / ``"per-head"``) or per channel
  (``"per-element"``): headwise's ``output_gate = "softplus_head"`` / ``"softplus_element"``
  (:data:`headwise.model.features.OUTPUT_GATES`). Laguna always has it;
- **RoPE per layer type** (``rope_parameters`` keyed by ``full_attention`` / ``sliding_attention``,
  each with its theta and partial rotary factor): headwise has one ``rope_theta`` and
  ``partial_rotary_factor`` for every layer, so a Laguna config whose two layer types differ is
  refused, and an export writes the same parameters under both keys.

Sliding-window layers (``layer_types``) are headwise's ``local`` layers. Laguna's MoE layers
(``mlp_layer_types = "sparse"``) have no headwise counterpart: only dense models convert. The
weights live where Qwen3 keeps them (:data:`headwise.hf.llama.LAYOUT`), the gate at
``self_attn.g_proj``.

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import (
    Layout, check_expressible, fixed_field_problem, from_architecture, kind_problem, kinds_from_arch, kinds_to_arch,
    options_from_arch, options_to_arch, to_architecture,
)
from headwise.hf.llama import LAYOUT as LLAMA_LAYOUT
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec

ARCH, LABEL, MODEL_CLASS = "laguna", "Laguna", "LagunaForCausalLM"
#: what Laguna's block fixes, as (spec field, required value, why)
FIXED = (
    ("inputs", "tokens", "it reads token ids"),
    ("causal", True, "it is a decoder"),
    ("norm", "rmsnorm_pre", "its blocks are pre-norm RMSNorm"),
    ("positions", "rope", "it has rotary positions"),
    ("activation", "swiglu", "its MLP is SwiGLU"),
    ("score_scale", "inv_sqrt", "it scales attention scores by 1/sqrt(head_dim)"),
    ("qk_norm", "rmsnorm", "Laguna normalises each head's q and k (RMSNorm)"),
    ("mlp_bias", False, "Laguna's MLP has no biases"),
    ("embedding_norm", None, "it has no norm on its embeddings"),
    ("dropout", 0.0, "it has no residual or embedding dropout"),
    ("drop_path", None, "it has no stochastic depth"),
)
#: headwise's output gates and Laguna's ``gating``
GATING = {"softplus_head": "per-head", "softplus_element": "per-element"}
#: Laguna's layer types, whose RoPE parameters an export sets alike
LAYER_TYPES = ("full_attention", "sliding_attention")


def incompatibility(spec: ModelSpec) -> str | None:
    """Why ``LagunaForCausalLM`` cannot express ``spec``, or None when it can."""
    if spec.output_head != "lm":
        return f"outputs = {spec.output_head!r}: {MODEL_CLASS} ends in a language-model head"
    for name, values, what in (("key/value heads", spec.kv_heads_per_layer, "num_key_value_heads"),
                               ("head widths", spec.head_dims, "head_dim"),
                               ("MLP widths", [s.mlp_hidden for s in spec.layers()], "intermediate_size")):
        if len(set(values)) != 1:
            return f"its layers have different {name} {values}; {LABEL} has one {what} for all layers"
    if spec.qkv_bias != spec.out_bias:
        return f"qkv_bias = {spec.qkv_bias} but out_bias = {spec.out_bias}; {LABEL}'s attention_bias sets both"
    if spec.output_gate not in GATING:
        return (f"output_gate = {spec.output_gate!r}: {LABEL} gates every head's outputs with a softplus "
                f"({', '.join(repr(g) for g in GATING)})")
    return fixed_field_problem(spec, list(FIXED)) or kind_problem(spec, ARCH, LABEL)


def to_config(spec: ModelSpec) -> Any:
    """The ``LagunaConfig`` equal to ``spec``; a HeadwiseError if Laguna cannot express it."""
    import transformers

    check_expressible(spec, incompatibility, LABEL)
    shape = spec.layer(0)
    kinds = kinds_to_arch(spec, ARCH)
    rope = {"rope_type": "default", "rope_theta": float(spec.rope_theta),
            "partial_rotary_factor": float(spec.partial_rotary_factor)}
    eos = min(50256, spec.vocab_size - 1)  # GPT-2's <|endoftext|> id, kept inside small test vocabularies
    return transformers.LagunaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=shape.mlp_hidden // 2,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=shape.heads,
        num_attention_heads_per_layer=list(spec.heads),
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=spec.max_seq_len,
        rms_norm_eps=spec.layer_norm_eps,
        rope_parameters={kind: dict(rope) for kind in LAYER_TYPES},
        attention_bias=spec.qkv_bias,
        gating=GATING[spec.output_gate],
        layer_types=kinds,
        mlp_layer_types=["dense"] * spec.n_layers,
        hidden_act="silu",
        initializer_range=spec.init_std,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=eos, eos_token_id=eos,
        **options_to_arch(spec, ARCH),
    )


def _rope(config: Any) -> dict[str, Any]:
    """The one RoPE (theta, partial rotary factor) of a Laguna config's layer types, as spec fields;
    a HeadwiseError where its layer types differ or use another RoPE."""
    params = config.rope_parameters or {}
    used = sorted(set(config.layer_types))
    found = {}
    for kind in used:
        rope = dict(params.get(kind) or {})
        if rope.get("rope_type", "default") != "default":
            raise HeadwiseError(f"cannot convert: {kind} layers have rope_parameters {rope}; headwise has the "
                                "default RoPE")
        found[kind] = (float(rope.get("rope_theta", 10000.0)), float(rope.get("partial_rotary_factor", 1.0)))
    if len(set(found.values())) > 1:
        raise HeadwiseError(f"cannot convert: its layer types have different RoPE (theta, partial rotary factor) "
                            f"{found}; headwise has one rope_theta and partial_rotary_factor for all layers")
    theta, factor = next(iter(found.values()))
    return {"rope_theta": theta, "partial_rotary_factor": factor}


def spec_from_config(config: Any) -> ModelSpec:
    """The ModelSpec of a dense ``LagunaConfig``."""
    if config.model_type != ARCH:
        raise HeadwiseError(f"cannot convert a {config.model_type!r} model as Laguna")
    if config.hidden_act != "silu":
        raise HeadwiseError(f"cannot convert: hidden_act = {config.hidden_act!r}; headwise's Llama-style MLP is "
                            "SwiGLU (silu)")
    sparse = [i for i, t in enumerate(config.mlp_layer_types) if t != "dense"]
    if sparse:
        raise HeadwiseError(f"cannot convert: layers {sparse} are mixture-of-experts (mlp_layer_types "
                            "'sparse'); headwise converts dense Laguna models only")
    n = config.num_hidden_layers
    heads = list(config.num_attention_heads_per_layer or [config.num_attention_heads] * n)
    head_dim = config.head_dim
    kinds = kinds_from_arch(list(config.layer_types), ARCH)
    gate = "softplus_head" if config.gating is True or config.gating == "per-head" else "softplus_element"
    fields: dict[str, Any] = options_from_arch(config, ARCH) if "local" in kinds else {}
    uniform_width = all(h * head_dim == config.hidden_size for h in heads)
    return ModelSpec(
        vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=n,
        max_seq_len=config.max_position_embeddings, heads=heads,
        kv_heads=None if all(h == config.num_key_value_heads for h in heads) else config.num_key_value_heads,
        head_dim=None if uniform_width else head_dim,
        mlp_hidden=2 * config.intermediate_size, activation="swiglu", norm="rmsnorm_pre",
        layer_norm_eps=config.rms_norm_eps, positions="rope", **_rope(config), qk_norm="rmsnorm",
        output_gate=gate, score_scale="inv_sqrt", qkv_bias=config.attention_bias, out_bias=config.attention_bias,
        mlp_bias=False, tie_embeddings=bool(config.tie_word_embeddings), init_std=config.initializer_range,
        attention=kinds, **fields,
    )


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """Qwen3's weight pairs and each layer's gate projection."""
    return LLAMA_LAYOUT.pairs(spec) + [(f"blocks.{i}.attn.gate.weight", f"model.layers.{i}.self_attn.g_proj.weight")
                                       for i in range(spec.n_layers)]


#: where Laguna keeps headwise's weights: Qwen3's places and the gate's
LAYOUT = Layout(_pairs, LLAMA_LAYOUT.qkv, LLAMA_LAYOUT.joined)


def to_hf(model: Transformer) -> Any:
    """A ``LagunaForCausalLM`` with exactly ``model``'s weights, in eval mode."""
    import transformers

    return to_architecture(model, transformers.LagunaForCausalLM(to_config(model.spec)), LAYOUT)


def from_hf(hf: Any) -> Transformer:
    """A headwise Transformer with exactly a dense ``LagunaForCausalLM``'s weights."""
    return from_architecture(hf, spec_from_config(hf.config), LAYOUT)
