"""Output gates: a learned gate on a layer's attention outputs, applied before the output
projection (``ModelSpec.output_gate``). Each gate is one :class:`OutputGate` in
:data:`OUTPUT_GATES`: its width per layer (how many gate values a position gets) and how the
gate's logits scale the attention outputs. The layer (:class:`headwise.model.transformer.Attention`)
holds the gate's projection ``gate`` (d_model -> width, no bias) of the same normed input that its
q, k and v project from.

- ``softplus_head``: one gate per head, ``softplus(x W_g)`` broadcast over the head's channels
  (Laguna's ``gating = true`` / ``"per-head"``);
- ``softplus_element``: one gate per channel of every head (Laguna's ``gating = "per-element"``).

Softplus is computed in float32 and the gate rounded to the outputs' dtype, as Laguna computes it.
Only torch is imported (inside the functions): an exported model carries this module
(:mod:`headwise.hf.export`), and :mod:`headwise.params` reads the widths without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class OutputGate:
    """One output gate: its ``name`` in ``ModelSpec.output_gate``, whether it has one value per
    head (else one per channel), and the activation applied to its logits."""

    name: str
    per_head: bool
    activation: str = "softplus"

    def width(self, heads: int, head_dim: int) -> int:
        """Gate values per position of a layer of ``heads`` heads of ``head_dim`` channels."""
        return heads if self.per_head else heads * head_dim

    def apply(self, logits: Tensor, y: Tensor) -> Tensor:
        """The attention outputs ``y`` [B, T, heads, head_dim] scaled by the gate of ``logits``
        [B, T, width] (the gate projection of the layer's input at the same positions)."""
        import torch.nn.functional as F

        gate = F.softplus(logits.float()).to(y.dtype)
        if self.per_head:
            return y * gate.unsqueeze(-1)
        return y * gate.view(y.shape)


#: every output gate, by the name ``ModelSpec.output_gate`` gives it
OUTPUT_GATES = {gate.name: gate for gate in (OutputGate("softplus_head", per_head=True),
                                             OutputGate("softplus_element", per_head=False))}


def gate_params(output_gate: str | None, d_model: int, heads: int, head_dim: int) -> int:
    """Parameters of a layer's gate projection (d_model -> the gate's width, no bias); 0 without a gate."""
    if output_gate is None:
        return 0
    return d_model * OUTPUT_GATES[output_gate].width(heads, head_dim)
