"""Conversion to and from Hugging Face ``LlamaForCausalLM`` and ``Qwen3ForCausalLM`` for the
Llama-style specs they can express.

The two models compute the same function: token embeddings, pre-RMSNorm blocks whose attention
has ``num_key_value_heads`` key/value heads (grouped-query attention), RoPE on q and k (Qwen3:
after an RMSNorm of each head's q and k), 1/sqrt(head_dim) scores, and a SwiGLU MLP; a final
RMSNorm and the LM head. The layouts differ only in where weights live: headwise fuses q, k and v
into one projection (q of every head, then k, then v) and the MLP's value and gate maps into one
(``up_proj`` first, then ``gate_proj``: ``swiglu`` in :data:`headwise.model.features.ACTIVATIONS`);
Hugging Face keeps them apart. Qwen3's sliding-window layers are headwise's ``local`` layers (the same keys).

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import (
    Layout, check_expressible, fixed_field_problem, from_architecture, kind_problem, kinds_from_arch, kinds_to_arch,
    options_from_arch, options_to_arch, to_architecture,
)
from headwise.model.transformer import Transformer
from headwise.spec import ModelSpec


@dataclass(frozen=True)
class Architecture:
    """What one Llama-style ``transformers`` architecture is, for the converters."""

    #: its key in ``AttentionKind.hf_names`` and its ``model_type``
    arch: str
    #: how errors name it
    label: str
    #: its ``transformers`` config and causal-LM classes
    config_class: str
    model_class: str
    #: what its block fixes, as (spec field, required value, why)
    fixed: tuple[tuple[str, object, str], ...]
    #: whether its config has ``mlp_bias`` (Qwen3's MLP has no biases)
    mlp_bias: bool
    #: whether its config has ``layer_types`` (Llama's layers are all full attention)
    layer_types: bool


_LLAMA_BLOCK = (
    ("inputs", "tokens", "it reads token ids"),
    ("causal", True, "it is a decoder"),
    ("norm", "rmsnorm_pre", "its blocks are pre-norm RMSNorm"),
    ("positions", "rope", "it has rotary positions"),
    ("partial_rotary_factor", 1.0, "its default RoPE rotates every channel of a head"),
    ("activation", "swiglu", "its MLP is SwiGLU"),
    ("score_scale", "inv_sqrt", "it scales attention scores by 1/sqrt(head_dim)"),
    ("embedding_norm", None, "it has no norm on its embeddings"),
    ("dropout", 0.0, "it has no residual or embedding dropout"),
    ("drop_path", None, "it has no stochastic depth"),
    ("output_gate", None, "it has no gate on the attention outputs"),
)
LLAMA = Architecture("llama", "Llama", "LlamaConfig", "LlamaForCausalLM",
                     _LLAMA_BLOCK + (("qk_norm", None, "Llama does not normalise q and k"),),
                     mlp_bias=True, layer_types=False)
QWEN3 = Architecture("qwen3", "Qwen3", "Qwen3Config", "Qwen3ForCausalLM",
                     _LLAMA_BLOCK + (("qk_norm", "rmsnorm", "Qwen3 normalises each head's q and k (RMSNorm)"),
                                     ("mlp_bias", False, "Qwen3's MLP has no biases")),
                     mlp_bias=False, layer_types=True)
ARCHITECTURES = {a.arch: a for a in (LLAMA, QWEN3)}


def incompatibility(spec: ModelSpec, arch: Architecture = LLAMA) -> str | None:
    """Why ``arch`` cannot express ``spec``, or None when it can."""
    if spec.output_head != "lm":
        return f"outputs = {spec.output_head!r}: {arch.model_class} ends in a language-model head"
    for name, values, what in (("heads", spec.heads, "num_attention_heads"),
                               ("key/value heads", spec.kv_heads_per_layer, "num_key_value_heads"),
                               ("head widths", spec.head_dims, "head_dim"),
                               ("MLP widths", [s.mlp_hidden for s in spec.layers()], "intermediate_size")):
        if len(set(values)) != 1:
            return f"its layers have different {name} {values}; {arch.label} has one {what} for all layers"
    if spec.qkv_bias != spec.out_bias:
        return (f"qkv_bias = {spec.qkv_bias} but out_bias = {spec.out_bias}; {arch.label}'s attention_bias sets "
                "both")
    return fixed_field_problem(spec, list(arch.fixed)) or kind_problem(spec, arch.arch, arch.label)


def to_config(spec: ModelSpec, arch: Architecture = LLAMA) -> Any:
    """The ``transformers`` config of ``arch`` equal to ``spec``; a HeadwiseError if it cannot express it."""
    import transformers

    check_expressible(spec, lambda s: incompatibility(s, arch), arch.label)
    shape = spec.layer(0)
    extra: dict[str, Any] = {"mlp_bias": spec.mlp_bias} if arch.mlp_bias else {}
    if arch.layer_types:
        kinds = kinds_to_arch(spec, arch.arch)
        extra.update(layer_types=kinds, use_sliding_window="sliding_attention" in kinds,
                     **options_to_arch(spec, arch.arch))
    eos = min(50256, spec.vocab_size - 1)  # GPT-2's <|endoftext|> id, kept inside small test vocabularies
    return getattr(transformers, arch.config_class)(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=shape.mlp_hidden // 2,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=spec.max_seq_len,
        rms_norm_eps=spec.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        attention_bias=spec.qkv_bias,
        hidden_act="silu",
        initializer_range=spec.init_std,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=eos, eos_token_id=eos,
        **extra,
    )


def spec_from_config(config: Any) -> ModelSpec:
    """The ModelSpec of a ``LlamaConfig`` or ``Qwen3Config``."""
    arch = ARCHITECTURES.get(config.model_type)
    if arch is None:
        raise HeadwiseError(f"cannot convert a {config.model_type!r} model: headwise reads "
                            f"{', '.join(ARCHITECTURES)} here")
    if config.hidden_act != "silu":
        raise HeadwiseError(f"cannot convert: hidden_act = {config.hidden_act!r}; headwise's Llama-style MLP is "
                            "SwiGLU (silu)")
    rope = dict(config.rope_parameters or {})
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise HeadwiseError(f"cannot convert: rope_parameters {rope}; headwise has the default RoPE")
    heads, n = config.num_attention_heads, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = config.num_key_value_heads or heads
    fields: dict[str, Any] = {}
    if arch.layer_types:
        kinds = kinds_from_arch(list(config.layer_types), arch.arch)
        fields["attention"] = kinds
        if "local" in kinds:
            fields.update(options_from_arch(config, arch.arch))
    return ModelSpec(
        vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=n,
        max_seq_len=config.max_position_embeddings, heads=[heads] * n, kv_heads=None if kv == heads else kv,
        head_dim=None if head_dim * heads == config.hidden_size else head_dim,
        mlp_hidden=2 * config.intermediate_size, activation="swiglu", norm="rmsnorm_pre",
        layer_norm_eps=config.rms_norm_eps, positions="rope", rope_theta=rope.get("rope_theta", 10000.0),
        qk_norm="rmsnorm" if arch is QWEN3 else None, score_scale="inv_sqrt",
        qkv_bias=config.attention_bias, out_bias=config.attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)), tie_embeddings=bool(config.tie_word_embeddings),
        init_std=config.initializer_range, **fields,
    )


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """(headwise name, transformers name) of every weight but the fused q/k/v and MLP input maps."""
    pairs = [("tok_emb.weight", "model.embed_tokens.weight"), ("norm_f.weight", "model.norm.weight")]
    for i in range(spec.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        pairs += [(ours + "norm1.weight", theirs + "input_layernorm.weight"),
                  (ours + "norm2.weight", theirs + "post_attention_layernorm.weight"),
                  (ours + "attn.out.weight", theirs + "self_attn.o_proj.weight"),
                  (ours + "mlp.proj.weight", theirs + "mlp.down_proj.weight")]
        if spec.out_bias:
            pairs.append((ours + "attn.out.bias", theirs + "self_attn.o_proj.bias"))
        if spec.mlp_bias:
            pairs.append((ours + "mlp.proj.bias", theirs + "mlp.down_proj.bias"))
        if spec.qk_norm:
            pairs += [(ours + "attn.q_norm.weight", theirs + "self_attn.q_norm.weight"),
                      (ours + "attn.k_norm.weight", theirs + "self_attn.k_norm.weight")]
    if not spec.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight"))
    return pairs


def _joined(spec: ModelSpec) -> list[tuple[str, list[str]]]:
    """The MLP's fused value and gate map: ``up_proj`` then ``gate_proj``."""
    parts = ("weight", "bias") if spec.mlp_bias else ("weight",)
    return [(f"blocks.{i}.mlp.fc.{p}", [f"model.layers.{i}.mlp.{m}_proj.{p}" for m in ("up", "gate")])
            for i in range(spec.n_layers) for p in parts]


#: where Llama and Qwen3 keep headwise's weights
LAYOUT = Layout(_pairs, lambda i, part: [f"model.layers.{i}.self_attn.{p}_proj.{part}" for p in "qkv"], _joined)


def to_hf(model: Transformer, arch: Architecture = LLAMA) -> Any:
    """A ``LlamaForCausalLM`` (or ``arch``'s class) with exactly ``model``'s weights, in eval mode."""
    import transformers

    hf = getattr(transformers, arch.model_class)(to_config(model.spec, arch))
    return to_architecture(model, hf, LAYOUT)


def from_hf(hf: Any) -> Transformer:
    """A headwise Transformer with exactly a ``LlamaForCausalLM``'s or ``Qwen3ForCausalLM``'s weights."""
    return from_architecture(hf, spec_from_config(hf.config), LAYOUT)
