"""``LagunaForCausalLM`` (transformers 5.x, ``models/laguna``) as an
:class:`~headwise.hf.convert.Architecture`, for the dense Llama-style specs it expresses.

Laguna's block is Qwen3's (:mod:`headwise.hf.llama`) with three differences, each a headwise option:

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
"""

from __future__ import annotations

from typing import Any

from headwise.errors import HeadwiseError
from headwise.hf.convert import Architecture, Layout, kind_fields, kinds_to_arch, options_to_arch
from headwise.hf.llama import BLOCK, LAYOUT, MAPS, UNIFORM, attention_bias, read_block, rope_theta, write_block
from headwise.spec import ModelSpec

#: headwise's output gates and Laguna's ``gating``
GATING = {"softplus_head": "per-head", "softplus_element": "per-element"}
#: Laguna's layer types, whose RoPE parameters an export sets alike
LAYER_TYPES = ("full_attention", "sliding_attention")


def _gate(spec: ModelSpec) -> str | None:
    if spec.output_gate not in GATING:
        return (f"output_gate = {spec.output_gate!r}: Laguna gates every head's outputs with a softplus "
                f"({', '.join(repr(g) for g in GATING)})")
    return None


def _write(spec: ModelSpec) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": float(spec.rope_theta),
            "partial_rotary_factor": float(spec.partial_rotary_factor)}
    return write_block(spec) | dict(
        num_attention_heads_per_layer=list(spec.heads), rope_parameters={kind: dict(rope) for kind in LAYER_TYPES},
        gating=GATING[spec.output_gate], layer_types=kinds_to_arch(spec, "laguna"),
        mlp_layer_types=["dense"] * spec.n_layers, **options_to_arch(spec, "laguna"))


def _rope(config: Any) -> dict[str, Any]:
    """The one RoPE (theta, partial rotary factor) of a Laguna config's layer types, as spec fields;
    a HeadwiseError where its layer types differ or use another RoPE."""
    params = config.rope_parameters or {}
    found = {}
    for kind in sorted(set(config.layer_types)):
        rope = dict(params.get(kind) or {})
        found[kind] = (rope_theta(rope, f"{kind} layers have rope_parameters"),
                       float(rope.get("partial_rotary_factor", 1.0)))
    if len(set(found.values())) > 1:
        raise HeadwiseError(f"cannot convert: its layer types have different RoPE (theta, partial rotary factor) "
                            f"{found}; headwise has one rope_theta and partial_rotary_factor for all layers")
    theta, factor = next(iter(found.values()))
    return {"rope_theta": theta, "partial_rotary_factor": factor}


def _read(config: Any) -> dict[str, Any]:
    sparse = [i for i, t in enumerate(config.mlp_layer_types) if t != "dense"]
    if sparse:
        raise HeadwiseError(f"cannot convert: layers {sparse} are mixture-of-experts (mlp_layer_types "
                            "'sparse'); headwise converts dense Laguna models only")
    heads = list(config.num_attention_heads_per_layer or [config.num_attention_heads] * config.num_hidden_layers)
    gate = "softplus_head" if config.gating is True or config.gating == "per-head" else "softplus_element"
    return read_block(config, heads) | _rope(config) | kind_fields(list(config.layer_types), "laguna", config) | {
        "output_gate": gate}


def _pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """Qwen3's weight pairs and each layer's gate projection."""
    return LAYOUT.pairs(spec) + [(f"blocks.{i}.attn.gate.weight", f"model.layers.{i}.self_attn.g_proj.weight")
                                 for i in range(spec.n_layers)]


LAGUNA = Architecture(
    "laguna", "laguna", "Laguna", "LagunaForCausalLM", "tokens", "lm",
    maps=MAPS | {"partial_rotary_factor", "output_gate"},
    fixed=(*BLOCK, ("qk_norm", "rmsnorm", "Laguna normalises each head's q and k (RMSNorm)"),
           ("mlp_bias", False, "Laguna's MLP has no biases")),
    write=_write, read=_read, uniform=UNIFORM, rules=(attention_bias("Laguna"), _gate),
    layout=Layout(_pairs, LAYOUT.qkv, LAYOUT.joined),
)
