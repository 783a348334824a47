"""The spec as the exported modelling code sees it: plain attributes, no validation.

``headwise export --hf`` copies the model modules into the exported folder, where ``headwise``
is not installed. There, their ``from headwise.spec import ...`` reads from this module instead,
so it provides the names they import (``ModelSpec``, and ``LayerShape`` from its own
standard-library module) with only the standard library. The fields come resolved from ``config.json`` (written by
:func:`headwise.hf.models.config_for`): nothing is derived here,
so the exported model cannot drift from the spec headwise validated.
"""

from __future__ import annotations

from typing import Any

from headwise.layer_shape import LayerShape


class ModelSpec:
    """A resolved spec: every field of ``headwise.spec.ModelSpec`` as an attribute, plus the
    ``output_head`` it resolved to and each layer's :class:`LayerShape`."""

    def __init__(self, fields: dict[str, Any], layers: list[dict[str, Any]]) -> None:
        self.__dict__.update(fields)
        self._layers = [LayerShape(**layer) for layer in layers]

    def layers(self) -> list[LayerShape]:
        """Resolved shapes of every layer."""
        return list(self._layers)
