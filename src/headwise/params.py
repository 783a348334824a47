"""Exact, analytic parameter counts of a :class:`~headwise.spec.ModelSpec`.

``count_params(spec)`` equals ``sum(p.numel() for p in Transformer(spec).parameters())`` for every
spec (a test checks this across the option space), so studies can match parameter budgets
without building models.
"""

from __future__ import annotations

from headwise.model.frontends import FRONT_ENDS, position_params
from headwise.model.heads import OUTPUT_HEADS
from headwise.spec import LayerShape, ModelSpec


def norm_params(spec: ModelSpec) -> int:
    """Parameters of one normalisation layer: LayerNorm has weight and bias, unit-norm one scalar."""
    return 2 * spec.d_model if spec.norm == "layernorm_pre" else 1


def attention_params(spec: ModelSpec, shape: LayerShape) -> int:
    """q, k, v (d_model -> width, fused), the output projection (width -> d_model), and a Nyström
    layer's convolution."""
    d, w = spec.d_model, shape.width
    qkv = 3 * d * w + (3 * w if spec.qkv_bias else 0)
    out = w * d + (d if spec.out_bias else 0)
    # a nystrom layer's depthwise convolution on values: one kernel per head, no bias
    conv = shape.heads * spec.nystrom_conv if shape.attention == "nystrom" and spec.nystrom_conv else 0
    return qkv + out + conv


def mlp_params(spec: ModelSpec, shape: LayerShape) -> int:
    """Two linear maps d_model -> hidden -> d_model."""
    d, h = spec.d_model, shape.mlp_hidden
    bias = h + d if spec.mlp_bias else 0
    return 2 * d * h + bias


def block_params(spec: ModelSpec, i: int) -> int:
    """All parameters of block ``i``: two norms, attention and MLP."""
    shape = spec.layer(i)
    return 2 * norm_params(spec) + attention_params(spec, shape) + mlp_params(spec, shape)


def param_breakdown(spec: ModelSpec) -> dict[str, int]:
    """Parameter count per component (the front end's, each block, the final norm, the output
    head's); the values sum to :func:`count_params`."""
    parts = dict(FRONT_ENDS[spec.inputs].param_counts(spec))
    for i in range(spec.n_layers):
        parts[f"block_{i}"] = block_params(spec, i)
    # Pre-norm models end with a final LayerNorm; post-norm blocks already end normalised.
    parts["final_norm"] = 2 * spec.d_model if spec.norm == "layernorm_pre" else 0
    parts.update(OUTPUT_HEADS[spec.output_head].param_counts(spec))
    return parts


def count_params(spec: ModelSpec) -> int:
    """Total number of trainable parameters (tied weights counted once)."""
    return sum(param_breakdown(spec).values())


def flops_per_token(spec: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per unit of a task whose examples are ``seq_len`` units long (tokens for
    sequences; for images one image, ``seq_len = 1``): 6N T + 12 T^2 * sum of attention widths,
    per example of T positions (the front end says how many), divided by ``seq_len``.

    N counts every matmul weight, the output head included (PaLM appendix B; nanoGPT's
    ``estimate_mfu``); the second term is the attention score and value products, and uses each
    layer's own attention width, so it is exact for heterogeneous layers. For sequences this is
    6N + 12 T * widths per token. A classifier applied once per image is counted at every
    position (under 1% of a ViT-B's FLOPs).
    """
    t = FRONT_ENDS[spec.inputs].positions(spec, seq_len)
    n = count_params(spec) - position_params(spec)
    attn = sum(12 * s.width * t for s in spec.layers())
    return round((6 * n + attn) * t / seq_len)
