"""``LlamaForCausalLM`` and ``Qwen3ForCausalLM`` as :class:`~headwise.hf.convert.Architecture`
records, and what they share with Laguna (:mod:`headwise.hf.laguna`).

The models compute headwise's function: token embeddings, pre-RMSNorm blocks whose attention has
``num_key_value_heads`` key/value heads (grouped-query attention), RoPE on q and k (Qwen3: after
an RMSNorm of each head's q and k), 1/sqrt(head_dim) scores, and a SwiGLU MLP; a final RMSNorm
and the LM head. headwise fuses the MLP's value and gate maps into one (``up_proj`` first, then
``gate_proj``: ``swiglu`` in :data:`headwise.model.features.ACTIVATIONS`). Qwen3's
sliding-window layers are headwise's ``local`` layers (the same keys).

``transformers`` is imported lazily: it is needed to export or compare, never to train.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import Architecture, Fixed, Layout, kind_fields, kinds_to_arch, options_to_arch
from headwise.spec import ModelSpec

#: what a Llama-style block fixes (Llama, Qwen3, Laguna)
BLOCK: tuple[Fixed, ...] = (
    ("causal", True, "it is a decoder"),
    ("norm", "rmsnorm_pre", "its blocks are pre-norm RMSNorm"),
    ("positions", "rope", "it has rotary positions"),
    ("activation", "swiglu", "its MLP is SwiGLU"),
    ("score_scale", "inv_sqrt", "it scales attention scores by 1/sqrt(head_dim)"),
    ("embedding_norm", None, "it has no norm on its embeddings"),
    ("dropout", 0.0, "it has no residual or embedding dropout"),
    ("drop_path", None, "it has no stochastic depth"),
)
#: the spec fields a Llama-style config holds (Llama, Qwen3, Laguna)
MAPS = frozenset({"vocab_size", "d_model", "n_layers", "max_seq_len", "heads", "kv_heads", "head_dim", "mlp_hidden",
                  "mlp_ratio", "attention", "layer_norm_eps", "rope_theta", "qkv_bias", "out_bias", "tie_embeddings",
                  "init_std"})
#: the per-layer quantities a Llama-style config has one of
UNIFORM = (("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"), ("mlp_hidden", "intermediate_size"))


def attention_bias(label: str) -> Callable[[ModelSpec], str | None]:
    """The rule that ``label``'s ``attention_bias`` sets both the q/k/v and the output biases."""
    def rule(spec: ModelSpec) -> str | None:
        if spec.qkv_bias != spec.out_bias:
            return f"qkv_bias = {spec.qkv_bias} but out_bias = {spec.out_bias}; {label}'s attention_bias sets both"
        return None
    return rule


def _heads_divide_width(spec: ModelSpec) -> str | None:
    """``LlamaConfig`` refuses a ``hidden_size`` that its head count does not divide, even with its
    own ``head_dim`` (a pruned model's 3 heads of 8 over d_model 32)."""
    if spec.d_model % spec.heads[0]:
        return (f"d_model {spec.d_model} is not a multiple of its {spec.heads[0]} heads, which LlamaConfig requires "
                "(whatever its head_dim)")
    return None


def write_block(spec: ModelSpec) -> dict[str, Any]:
    """The config fields of ``spec`` that Llama, Qwen3 and Laguna share."""
    shape = spec.layer(0)
    eos = min(50256, spec.vocab_size - 1)  # GPT-2's <|endoftext|> id, kept inside small test vocabularies
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=shape.mlp_hidden // 2,
                num_hidden_layers=spec.n_layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim, max_position_embeddings=spec.max_seq_len, rms_norm_eps=spec.layer_norm_eps,
                attention_bias=spec.qkv_bias, hidden_act="silu", initializer_range=spec.init_std,
                tie_word_embeddings=spec.tie_embeddings, bos_token_id=eos, eos_token_id=eos)


def read_block(config: Any, heads: list[int]) -> dict[str, Any]:
    """The spec fields of a Llama-style config (of layers of ``heads`` query heads) that Llama,
    Qwen3 and Laguna share."""
    if config.hidden_act != "silu":
        raise HeadwiseError(f"cannot convert: hidden_act = {config.hidden_act!r}; headwise's Llama-style MLP is "
                            "SwiGLU (silu)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads[0]
    kv = config.num_key_value_heads or heads[0]
    return dict(vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                max_seq_len=config.max_position_embeddings, heads=heads,
                kv_heads=None if all(h == kv for h in heads) else kv,
                head_dim=None if all(h * head_dim == config.hidden_size for h in heads) else head_dim,
                mlp_hidden=2 * config.intermediate_size, layer_norm_eps=config.rms_norm_eps,
                qkv_bias=config.attention_bias, out_bias=config.attention_bias,
                tie_embeddings=bool(config.tie_word_embeddings), init_std=config.initializer_range)


def rope_theta(rope: dict[str, Any], where: str = "rope_parameters") -> float:
    """The theta of one of a config's ``rope_parameters``; a HeadwiseError where it is not the default RoPE."""
    if rope.get("rope_type", "default") != "default":
        raise HeadwiseError(f"cannot convert: {where} {rope}; headwise has the default RoPE")
    return float(rope.get("rope_theta", 10000.0))


def _write(spec: ModelSpec, qwen3: bool) -> dict[str, Any]:
    fields = write_block(spec) | {"rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta}}
    if not qwen3:
        return fields | {"mlp_bias": spec.mlp_bias}
    kinds = kinds_to_arch(spec, "qwen3")
    return fields | dict(layer_types=kinds, use_sliding_window="sliding_attention" in kinds,
                         **options_to_arch(spec, "qwen3"))


def _read(config: Any, qwen3: bool) -> dict[str, Any]:
    rope = dict(config.rope_parameters or {})
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise HeadwiseError(f"cannot convert: rope_parameters {rope}; headwise has the default RoPE")
    fields = read_block(config, [config.num_attention_heads] * config.num_hidden_layers) | {
        "rope_theta": rope_theta(rope)}
    if qwen3:
        return fields | kind_fields(list(config.layer_types), "qwen3", config)
    return fields | {"mlp_bias": bool(getattr(config, "mlp_bias", False))}


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


#: where Llama, Qwen3 (and Laguna, with its gate) keep headwise's weights
LAYOUT = Layout(_pairs, lambda i, part: [f"model.layers.{i}.self_attn.{p}_proj.{part}" for p in "qkv"], _joined)
_ROPE = ("partial_rotary_factor", 1.0, "its default RoPE rotates every channel of a head")
_NO_GATE = ("output_gate", None, "it has no gate on the attention outputs")
LLAMA = Architecture(
    "llama", "llama", "Llama", "LlamaForCausalLM", "tokens", "lm", maps=MAPS | {"mlp_bias"},
    fixed=(*BLOCK, _ROPE, _NO_GATE, ("qk_norm", None, "Llama does not normalise q and k")),
    write=lambda spec: _write(spec, qwen3=False), read=lambda config: _read(config, qwen3=False),
    uniform=(("heads", "num_attention_heads"), *UNIFORM), rules=(attention_bias("Llama"), _heads_divide_width),
    layout=LAYOUT,
)
QWEN3 = Architecture(
    "qwen3", "qwen3", "Qwen3", "Qwen3ForCausalLM", "tokens", "lm", maps=MAPS,
    fixed=(*BLOCK, _ROPE, _NO_GATE, ("qk_norm", "rmsnorm", "Qwen3 normalises each head's q and k (RMSNorm)"),
           ("mlp_bias", False, "Qwen3's MLP has no biases")),
    write=lambda spec: _write(spec, qwen3=True), read=lambda config: _read(config, qwen3=True),
    uniform=(("heads", "num_attention_heads"), *UNIFORM), rules=(attention_bias("Qwen3"),), layout=LAYOUT,
)
