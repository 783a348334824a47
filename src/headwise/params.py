"""Exact, analytic parameter counts of a :class:`~headwise.spec.ModelSpec`.

``count_params(spec)`` equals ``sum(p.numel() for p in Transformer(spec).parameters())`` for every
spec (a test checks this across the option space), so studies can match parameter budgets
without building models. It reads the parts' declarations, not their model code: counting loads no
torch.
"""

from __future__ import annotations

from headwise.model.attention import ATTENTION_KINDS
from headwise.model.features import ACTIVATIONS, EMBEDDING_NORMS, NORMS, OUTPUT_GATES, QK_NORMS
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, position_params
from headwise.spec import LayerShape, ModelSpec


def norm_params(spec: ModelSpec) -> int:
    """Parameters of one normalisation layer of a block (its ``norm`` record's)."""
    return NORMS[spec.norm].params(spec.d_model)


def attention_params(spec: ModelSpec, shape: LayerShape) -> int:
    """q (d_model -> width) with k and v (d_model -> kv_width each), fused; the output projection
    (width -> d_model); the q/k norms (a head_dim weight each); the output gate's projection
    (d_model -> heads or width, no bias); and what the layer's attention kind adds (a Nyström
    layer's convolution)."""
    d, w = spec.d_model, shape.width
    projected = w + 2 * shape.kv_width
    qkv = d * projected + (projected if spec.qkv_bias else 0)
    out = w * d + (d if spec.out_bias else 0)
    qk_norm = 2 * QK_NORMS[spec.qk_norm].params(shape.head_dim) if spec.qk_norm is not None else 0
    gate = OUTPUT_GATES[spec.output_gate].params(spec, shape) if spec.output_gate is not None else 0
    return qkv + out + qk_norm + gate + ATTENTION_KINDS[shape.attention].params(spec, shape)


def mlp_params(spec: ModelSpec, shape: LayerShape) -> int:
    """Two linear maps d_model -> hidden -> d_model; after a gated activation the second reads
    hidden / 2 (the products of the value and gate halves)."""
    d, h = spec.d_model, shape.mlp_hidden
    inner = h // 2 if ACTIVATIONS[spec.activation].gated else h
    bias = h + d if spec.mlp_bias else 0
    return d * h + inner * d + bias


def block_params(spec: ModelSpec, i: int) -> int:
    """All parameters of block ``i``: two norms, attention and MLP."""
    shape = spec.layer(i)
    return 2 * norm_params(spec) + attention_params(spec, shape) + mlp_params(spec, shape)


def param_breakdown(spec: ModelSpec) -> dict[str, int]:
    """Parameter count per component (the front end's, each block, the final norm, the output
    head's); the values sum to :func:`count_params`."""
    parts = dict(FRONT_END_PARTS[spec.inputs].param_counts(spec))
    if spec.embedding_norm is not None:
        parts["embedding_norm"] = EMBEDDING_NORMS[spec.embedding_norm].params(spec.d_model)
    for i in range(spec.n_layers):
        parts[f"block_{i}"] = block_params(spec, i)
    # Pre-norm models end with a final norm; post-norm blocks already end normalised.
    parts["final_norm"] = norm_params(spec) if NORMS[spec.norm].pre else 0
    parts.update(OUTPUT_HEAD_PARTS[spec.output_head].param_counts(spec))
    return parts


def count_params(spec: ModelSpec) -> int:
    """Total number of trainable parameters (tied weights counted once)."""
    return sum(param_breakdown(spec).values())


def attention_flops(spec: ModelSpec, shape: LayerShape, t: int) -> float:
    """Training FLOPs (forward and backward: 6 per multiply-add) of one layer's attention products
    over a sequence of ``t`` positions, beyond its projections, as its kind counts them
    (:meth:`~headwise.model.attention.AttentionKind.flops`; softmax attention: q k^T and the
    weighted sum of v, 2 t^2 width multiply-adds)."""
    return ATTENTION_KINDS[shape.attention].flops(spec, shape, t)


def flops_per_token(spec: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per unit of a task whose examples are ``seq_len`` units long (tokens for
    sequences, both documents of a pair; one image, ``seq_len = 1``): per sequence of T positions
    (the front end says how many, and how many sequences an example is), 6N T plus each layer's
    :func:`attention_flops`, divided by ``seq_len``.

    N counts every matmul weight, the output head included (PaLM appendix B; nanoGPT's
    ``estimate_mfu``); the attention term uses each layer's own width and kind, so it is exact for
    heterogeneous layers. For softmax sequences this is 6N + 12 T * widths per token. A classifier
    applied once per sequence is counted at every position (under 1% of a ViT-B's FLOPs).
    """
    front = FRONT_END_PARTS[spec.inputs]
    t = front.positions(spec, seq_len)
    n = count_params(spec) - position_params(spec)
    per_sequence = 6 * n * t + sum(attention_flops(spec, s, t) for s in spec.layers())
    return round(per_sequence * front.sequences_per_example / seq_len)


#: bytes per cached key or value element, by the dtype the cache is kept in
KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def kv_cache_bytes_per_token(spec: ModelSpec, dtype: str = "fp32") -> int:
    """Bytes the key/value cache grows by per generated token: over the layers of a causal model,
    2 (key and value) x the layer's KV heads x its head_dim x the bytes of one ``dtype`` element
    (:data:`KV_DTYPE_BYTES`); 0 for a bidirectional model, which decodes nothing and keeps no cache.

    The cache stores only KV heads, so grouped-query attention shrinks it by heads / kv_heads.
    ``local`` (sliding-window) layers are counted at full context, as headwise's cache keeps them
    (:mod:`headwise.model.cache` keeps every position; a query reads the last ``window``); a cache
    that evicts beyond the window holds at most ``window`` tokens of such a layer, so past the window
    its per-token growth is the global layers' alone.
    """
    if dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown cache dtype {dtype!r}: one of {', '.join(KV_DTYPE_BYTES)}")
    if not spec.causal:
        return 0
    return sum(2 * s.kv_heads * s.head_dim * KV_DTYPE_BYTES[dtype] for s in spec.layers())


def kv_cache_budget(spec: ModelSpec) -> dict[str, int]:
    """:func:`kv_cache_bytes_per_token` for fp32 and bf16 (fp16's equals bf16's): what plans and
    run summaries report beside parameters and FLOPs."""
    return {dtype: kv_cache_bytes_per_token(spec, dtype) for dtype in ("fp32", "bf16")}


def plan_budget(spec: ModelSpec, seq_len: int, dtype: str = "fp32") -> dict[str, int]:
    """Every budget a search may put on a model, exactly, by name: ``params``, ``flops_per_token``
    (over a task ``seq_len`` long), ``kv_bytes_per_token`` (a ``dtype`` cache) and ``total_heads``."""
    return {"params": count_params(spec), "flops_per_token": flops_per_token(spec, seq_len),
            "kv_bytes_per_token": kv_cache_bytes_per_token(spec, dtype), "total_heads": spec.total_heads}
