"""``GPTNeoForCausalLM`` as an :class:`~headwise.hf.convert.Architecture`: learned positions,
pre-LayerNorm blocks of unscaled global or local attention, an ungated MLP with biases.

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from typing import Any

from headwise.hf.convert import (
    Architecture, Layout, activation_of, block_pairs, hidden_act, kind_fields, kinds_to_arch, one_kv_per_head,
    options_to_arch,
)
from headwise.model.features import ACTIVATIONS
from headwise.spec import ModelSpec


def _tied_width(spec: ModelSpec) -> str | None:
    if spec.head_dim is not None and any(hd * h != spec.d_model for hd, h in zip(spec.head_dims, spec.heads)):
        return f"its head width {spec.head_dims} is decoupled from d_model / heads; GPT-Neo ties them"
    return None


def _write(spec: ModelSpec) -> dict[str, Any]:
    eos = min(50256, spec.vocab_size - 1)  # GPT-2's <|endoftext|> id, kept inside small test vocabularies
    return dict(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.max_seq_len, hidden_size=spec.d_model,
        num_layers=spec.n_layers, num_heads=spec.heads[0], intermediate_size=spec.layer(0).mlp_hidden,
        attention_types=[[[k], 1] for k in kinds_to_arch(spec, "gpt_neo")], **options_to_arch(spec, "gpt_neo"),
        activation_function=ACTIVATIONS[spec.activation].hidden_act, embed_dropout=spec.dropout,
        attention_dropout=spec.dropout, resid_dropout=spec.dropout, layer_norm_epsilon=spec.layer_norm_eps,
        initializer_range=spec.init_std, tie_word_embeddings=spec.tie_embeddings, bos_token_id=eos,
        eos_token_id=eos,
    )


def _read(config: Any) -> dict[str, Any]:
    return dict(
        vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_layers,
        max_seq_len=config.max_position_embeddings, heads=[config.num_heads] * config.num_layers,
        mlp_hidden=config.intermediate_size or 4 * config.hidden_size,
        activation=activation_of(config.activation_function, "GPT-Neo"),
        **kind_fields(list(config.attention_layers), "gpt_neo", config), layer_norm_eps=config.layer_norm_epsilon,
        dropout=config.resid_dropout, init_std=config.initializer_range,
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


GPT_NEO = Architecture(
    "gpt-neo", "gpt_neo", "GPT-Neo", "GPTNeoForCausalLM", "tokens", "lm",
    maps=frozenset({"vocab_size", "max_seq_len", "d_model", "n_layers", "heads", "kv_heads", "head_dim", "mlp_hidden",
                    "mlp_ratio", "activation", "attention", "dropout", "layer_norm_eps", "init_std",
                    "tie_embeddings"}),
    fixed=(("norm", "layernorm_pre", "GPT-Neo uses pre-norm LayerNorm"),
           ("score_scale", "none", "GPT-Neo does not scale attention scores"),
           ("positions", "learned", "GPT-Neo has learned absolute positions"),
           ("causal", True, "GPT-Neo is a decoder"),
           ("qkv_bias", False, "GPT-Neo's q/k/v projections have no bias"),
           ("out_bias", True, "GPT-Neo's out_proj has a bias"),
           ("mlp_bias", True, "GPT-Neo's MLP has biases"),
           ("embedding_norm", None, "GPT-Neo has no LayerNorm on its embeddings"),
           ("qk_norm", None, "GPT-Neo does not normalise q and k"),
           ("output_gate", None, "GPT-Neo has no gate on the attention outputs")),
    write=_write, read=_read,
    uniform=(("heads", "num_heads"), ("mlp_hidden", "intermediate_size")),
    rules=(lambda spec: one_kv_per_head(spec, "GPT-Neo"), _tied_width, lambda spec: hidden_act(spec, "GPT-Neo")),
    layout=Layout(_pairs, lambda i, part: [f"transformer.h.{i}.attn.attention.{p}_proj.{part}" for p in "qkv"]),
)
