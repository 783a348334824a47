"""Key/value caches for incremental decoding."""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    """Keys and values of one layer's past positions, for incremental decoding.

    They live in buffers [B, heads, capacity, head_dim] that grow by doubling, so appending one
    position copies one position: concatenating instead would copy the whole past at every step
    (quadratic in the generated length).
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self.length = 0

    @property
    def k(self) -> Tensor | None:
        """Keys of the cached positions [B, heads, length, head_dim] (a view), or None."""
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> Tensor | None:
        """Values of the cached positions [B, heads, length, head_dim] (a view), or None."""
        return None if self._v is None else self._v[:, :, : self.length]

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` [B, heads, t, head_dim]; returns all keys and values so far."""
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # Writing into a buffer in place would break autograd: keep a functional copy.
            if self._k is not None:
                k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
            self._k, self._v, self.length = k, v, k.shape[2]
            return k, v
        start, end = self.length, self.length + k.shape[2]
        if self._k is None or end > self._k.shape[2] or self._k.dtype != k.dtype:
            b, h, _, d = k.shape
            capacity = max(end, 2 * start, 16)
            new_k = k.new_empty(b, h, capacity, d)
            new_v = v.new_empty(b, h, capacity, d)
            if start:
                new_k[:, :, :start] = self.k
                new_v[:, :, :start] = self.v
            self._k, self._v = new_k, new_v
        self._k[:, :, start:end] = k
        self._v[:, :, start:end] = v
        self.length = end
        return self.k, self.v


class KVCache:
    """Per-layer key/value caches plus the number of positions already processed."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.length = 0
