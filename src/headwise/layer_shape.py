"""``LayerShape``: the one record of what a layer is, for specs, plans, searches and run configs;
and :func:`divisors`, the head counts a layer's width allows.

Standard library only, so that the modelling code a model is exported with carries it too
(:mod:`headwise.hf.export`), and the exported spec view shares the class rather than a copy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerShape:
    """One layer's heads, head width, key/value heads, MLP width and attention kind.

    A spec's resolved layers (:meth:`headwise.spec.ModelSpec.layers`) set every field. A plan's
    or a search's layers may leave fields None, meaning "the base model's": what
    :meth:`headwise.spec.ModelSpec.with_layers` keeps of the spec it is applied to.
    """

    heads: int
    head_dim: int | None = None
    mlp_hidden: int | None = None
    attention: str | None = None
    #: key/value heads, each shared by ``heads / kv_heads`` query heads (None: as many as ``heads``)
    kv_heads: int | None = None

    @property
    def width(self) -> int:
        """Attention width: the size q projects to and the output projection reads (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The size k and v each project to (kv_heads x head_dim)."""
        return (self.kv_heads or self.heads) * self.head_dim


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending."""
    return [k for k in range(1, n + 1) if n % k == 0]
