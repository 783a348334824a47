"""Attention modules that keep each head's width when timm's models have no setting for it.

Leaner Transformers holds a head's width at the base model's as heads grow (ViT-B at 16 heads of
64, not 48): the attention is then ``heads * head_dim`` wide, not the model's width. timm's own
:class:`timm.layers.Attention` takes ``attn_head_dim``, so ViT and DeiT need only a subclass that
fixes it; XCiT's cross-covariance attention has no such setting, so a held-width XCA replaces it.
Imports torch and timm: :mod:`~headwise.families.vision.timm_models` loads this module when it builds.
"""

from __future__ import annotations

from functools import cache

import torch.nn.functional as F
from timm.layers import Attention
from timm.models.xcit import XCA
from torch import nn


@cache
def held_width_attention(head_dim: int) -> type[Attention]:
    """timm's :class:`Attention` with ``attn_head_dim`` fixed at ``head_dim``, for ViT's
    ``attn_layer``. A class, not a ``functools.partial``: timm asks ``issubclass`` of it."""

    class HeldWidthAttention(Attention):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, attn_head_dim=head_dim, **kwargs)

    HeldWidthAttention.__name__ = HeldWidthAttention.__qualname__ = f"HeldWidthAttention{head_dim}"
    return HeldWidthAttention


class HeldWidthXCA(XCA):
    """XCiT's cross-covariance attention with ``num_heads`` heads of ``head_dim`` channels each:
    q, k and v are ``num_heads * head_dim`` wide and the output projection maps that back to the
    model's width. Each head attends over its own channels, as in timm's :class:`XCA`, which is
    this module when ``head_dim == dim // num_heads``."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, qkv_bias: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.head_dim = head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=qkv_bias)
        self.proj = nn.Linear(num_heads * head_dim, dim)

    @classmethod
    def replacing(cls, xca: XCA, head_dim: int) -> HeldWidthXCA:
        """A held-width XCA with the settings (heads, biases, dropouts) of timm's ``xca``."""
        return cls(xca.qkv.in_features, xca.num_heads, head_dim, qkv_bias=xca.qkv.bias is not None,
                   attn_drop=xca.attn_drop.p, proj_drop=xca.proj_drop.p)

    def forward(self, x):
        """timm's XCA forward with the head width ``head_dim`` in place of ``C // num_heads``."""
        B, N, _ = x.shape
        # (qkv, B, heads, channels per head, N), as timm's
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            q = F.normalize(q, dim=-1) * self.temperature
            k = F.normalize(k, dim=-1)
            x = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        else:
            q = F.normalize(q, dim=-1)
            k = F.normalize(k, dim=-1)
            attn = ((q @ k.transpose(-2, -1)) * self.temperature).softmax(dim=-1)
            x = self.attn_drop(attn) @ v
        x = x.permute(0, 3, 1, 2).reshape(B, N, self.num_heads * self.head_dim)
        return self.proj_drop(self.proj(x))
