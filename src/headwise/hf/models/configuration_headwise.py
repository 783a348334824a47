"""``HeadwiseConfig``: a headwise model spec as a ``transformers`` configuration.

The spec travels whole (``spec``: every field, ``output_head`` resolved) with each layer's
resolved shape (``layer_shapes``), so the model is rebuilt exactly, heterogeneous layers
included; the usual ``transformers`` names (``hidden_size``, ``num_hidden_layers``, ...) are set
from it for the tools that read them. This module is copied into exported folders: it imports
only the standard library, ``transformers`` and its sibling ``spec_view``.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from .spec_view import ModelSpec


class HeadwiseConfig(PretrainedConfig):
    """The configuration of a headwise model (``model_type = "headwise"``)."""

    model_type = "headwise"

    def __init__(self, spec: dict[str, Any] | None = None, layer_shapes: list[dict[str, Any]] | None = None,
                 **kwargs: Any) -> None:
        self.spec = dict(spec or {})
        self.layer_shapes = [dict(s) for s in layer_shapes or []]
        s = self.spec
        kwargs.setdefault("tie_word_embeddings", bool(s.get("tie_embeddings", True)))
        #: whether forward() returns the keys and values for the next call (generate() reads it)
        self.use_cache = kwargs.pop("use_cache", True)
        super().__init__(**kwargs)
        # The names other tools read (pipelines, lm-eval's maximum length, KV caches). Per-layer
        # heads use the name transformers' own per-layer models use.
        self.vocab_size = s.get("vocab_size")
        self.hidden_size = s.get("d_model")
        self.num_hidden_layers = s.get("n_layers")
        self.max_position_embeddings = s.get("max_seq_len")
        self.num_attention_heads_per_layer = [shape["heads"] for shape in self.layer_shapes]
        self.head_dim_per_layer = [shape["head_dim"] for shape in self.layer_shapes]

    def model_spec(self) -> ModelSpec:
        """The spec the model is built from."""
        return ModelSpec(self.spec, self.layer_shapes)
