"""The spec as the exported modelling code sees it: plain attributes, no validation.

``headwise export --hf`` copies the model modules into the exported folder, where ``headwise``
is not installed. There, their ``from headwise.spec import ...`` reads from this module instead,
so it defines the names they import (``ModelSpec``, ``LayerShape``, ``GATED_ACTIVATIONS``,
``PRE_NORMS``) with
only the standard library. The fields come resolved from ``config.json`` (written by
:func:`headwise.hf.models.config_for`): nothing is derived here,
so the exported model cannot drift from the spec headwise validated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Gated activations (the same tuple as ``headwise.spec.GATED_ACTIVATIONS``)
GATED_ACTIVATIONS = ("geglu", "swiglu")
#: Norms before each sub-block (the same tuple as ``headwise.spec.PRE_NORMS``)
PRE_NORMS = ("layernorm_pre", "rmsnorm_pre")


@dataclass(frozen=True)
class LayerShape:
    """The resolved shape of one layer (as ``headwise.spec.LayerShape``)."""

    heads: int
    head_dim: int
    mlp_hidden: int
    attention: str
    #: key/value heads (None, as a config.json written before them has it: as many as ``heads``)
    kv_heads: int | None = None

    @property
    def width(self) -> int:
        """Attention width: the size q projects to and the output projection reads (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The size k and v each project to (kv_heads x head_dim)."""
        return (self.kv_heads or self.heads) * self.head_dim


class ModelSpec:
    """A resolved spec: every field of ``headwise.spec.ModelSpec`` as an attribute, plus the
    ``output_head`` it resolved to and each layer's :class:`LayerShape`."""

    def __init__(self, fields: dict[str, Any], layers: list[dict[str, Any]]) -> None:
        self.__dict__.update(fields)
        self._layers = [LayerShape(**layer) for layer in layers]

    def layers(self) -> list[LayerShape]:
        """Resolved shapes of every layer."""
        return list(self._layers)
