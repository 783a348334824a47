"""Conversion to and from Hugging Face ``GPTNeoForCausalLM`` for specs GPT-Neo can express.

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from typing import Any

from headwise.hf.convert import (
    Layout, block_pairs, check_expressible, fixed_field_problem, from_architecture, kind_problem, kinds_from_arch,
    kinds_to_arch, options_from_arch, options_to_arch, to_architecture,
)
from headwise.model.transformer import Transformer
from headwise.model.features import ACTIVATIONS
from headwise.spec import ModelSpec

# What GPT-Neo's block fixes, as (spec field, required value, why)
_GPT_NEO_FIXED = [
    ("norm", "layernorm_pre", "GPT-Neo uses pre-norm LayerNorm"),
    ("score_scale", "none", "GPT-Neo does not scale attention scores"),
    ("positions", "learned", "GPT-Neo has learned absolute positions"),
    ("causal", True, "GPT-Neo is a decoder"),
    ("qkv_bias", False, "GPT-Neo's q/k/v projections have no bias"),
    ("out_bias", True, "GPT-Neo's out_proj has a bias"),
    ("mlp_bias", True, "GPT-Neo's MLP has biases"),
    ("embedding_norm", None, "GPT-Neo has no LayerNorm on its embeddings"),
    ("qk_norm", None, "GPT-Neo does not normalise q and k"),
    ("output_gate", None, "GPT-Neo has no gate on the attention outputs"),
]


def gpt_neo_incompatibility(spec: ModelSpec) -> str | None:
    """Why GPT-Neo cannot express ``spec``, or None when it can."""
    if spec.inputs != "tokens":  # a ViT has no vocabulary either: say what it reads
        return f"it reads {spec.inputs}, not tokens; GPT-Neo reads token ids"
    if spec.output_head != "lm":
        return f"outputs = {spec.output_head!r}: GPT-Neo ends in a language-model head"
    if len(set(spec.heads)) != 1:
        return f"its layers have different head counts {spec.heads}; GPT-Neo has one num_heads for all layers"
    if spec.kv_heads_per_layer != spec.heads:
        return f"it has {spec.kv_heads_per_layer} key/value heads per layer; GPT-Neo has one per query head"
    if spec.head_dim is not None and any(hd * h != spec.d_model for hd, h in zip(spec.head_dims, spec.heads)):
        return f"its head width {spec.head_dims} is decoupled from d_model / heads; GPT-Neo ties them"
    hidden = {s.mlp_hidden for s in spec.layers()}
    if len(hidden) != 1:
        return f"its layers have different MLP widths {sorted(hidden)}"
    if ACTIVATIONS[spec.activation].gated:
        return f"activation = {spec.activation!r} is gated; GPT-Neo's MLP is not"
    return fixed_field_problem(spec, _GPT_NEO_FIXED) or kind_problem(spec, "gpt_neo", "GPT-Neo")


def to_gpt_neo_config(spec: ModelSpec) -> Any:
    """The ``GPTNeoConfig`` equal to ``spec``; a HeadwiseError if GPT-Neo cannot express it."""
    from transformers import GPTNeoConfig

    check_expressible(spec, gpt_neo_incompatibility, "GPT-Neo")
    return GPTNeoConfig(
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_seq_len,
        hidden_size=spec.d_model,
        num_layers=spec.n_layers,
        num_heads=spec.heads[0],
        intermediate_size=spec.layer(0).mlp_hidden,
        attention_types=[[[k], 1] for k in kinds_to_arch(spec, "gpt_neo")],
        **options_to_arch(spec, "gpt_neo"),
        activation_function=ACTIVATIONS[spec.activation].hidden_act,
        embed_dropout=spec.dropout,
        attention_dropout=spec.dropout,
        resid_dropout=spec.dropout,
        layer_norm_epsilon=spec.layer_norm_eps,
        initializer_range=spec.init_std,
        tie_word_embeddings=spec.tie_embeddings,
        # GPT-2's <|endoftext|> id, kept inside small test vocabularies
        bos_token_id=min(50256, spec.vocab_size - 1),
        eos_token_id=min(50256, spec.vocab_size - 1),
    )


def spec_from_gpt_neo_config(config: Any) -> ModelSpec:
    """The ModelSpec of a ``GPTNeoConfig``."""
    return ModelSpec(
        vocab_size=config.vocab_size,
        d_model=config.hidden_size,
        n_layers=config.num_layers,
        max_seq_len=config.max_position_embeddings,
        heads=[config.num_heads] * config.num_layers,
        mlp_hidden=config.intermediate_size or 4 * config.hidden_size,
        activation=config.activation_function,
        attention=kinds_from_arch(list(config.attention_layers), "gpt_neo"),
        **options_from_arch(config, "gpt_neo"),
        layer_norm_eps=config.layer_norm_epsilon,
        dropout=config.resid_dropout,
        init_std=config.initializer_range,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
    )


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """(headwise name, GPT-Neo name) pairs for everything but the fused q/k/v."""
    untied = [] if spec.tie_embeddings else [("lm_head.weight", "lm_head.weight")]
    return [("tok_emb.weight", "transformer.wte.weight"), ("pos_emb.weight", "transformer.wpe.weight"),
            ("norm_f.weight", "transformer.ln_f.weight"), ("norm_f.bias", "transformer.ln_f.bias"),
            *block_pairs(spec.n_layers, "transformer.h.", [("norm1", "ln_1"), ("norm2", "ln_2"),
                                                           ("attn.out", "attn.attention.out_proj"),
                                                           ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")]),
            *untied]


#: where GPT-Neo keeps headwise's weights
LAYOUT = Layout(_pairs, lambda i, part: [f"transformer.h.{i}.attn.attention.{p}_proj.{part}" for p in "qkv"])


def to_hf(model: Transformer) -> Any:
    """A ``GPTNeoForCausalLM`` with exactly ``model``'s weights."""
    from transformers import GPTNeoForCausalLM

    return to_architecture(model, GPTNeoForCausalLM(to_gpt_neo_config(model.spec)), LAYOUT)


def from_hf(hf: Any) -> Transformer:
    """A headwise Transformer with exactly a ``GPTNeoForCausalLM``'s weights."""
    return from_architecture(hf, spec_from_gpt_neo_config(hf.config), LAYOUT)
