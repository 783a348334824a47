"""``global`` attention: softmax attention over every key a position may see (every key of a
bidirectional layer; itself and every earlier one of a causal layer), one fused SDPA call
(:func:`headwise.model.kernels.attention`). The kind of every layer of a spec that names none;
GPT-Neo's ``global`` layers and every ViT layer."""

from __future__ import annotations

from headwise.model.attention import AttentionKind, register_kind


@register_kind
class GlobalAttention(AttentionKind):
    """Softmax attention: :class:`~headwise.model.attention.AttentionKind` as it is."""

    name = "global"
    default = True
    # bidirectional softmax attention weighs its keys by content alone (positions are in the
    # embeddings already), so reordering the positions reorders its outputs and nothing more
    reorderable = True
    hf_names = {"gpt_neo": "global", "vit": "global", "llama": "full_attention", "qwen3": "full_attention",
                "laguna": "full_attention"}
