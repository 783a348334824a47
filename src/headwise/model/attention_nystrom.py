"""``nystrom`` attention (Xiong et al. 2021): bidirectional softmax attention approximated through
``landmarks`` segment means of the queries and keys (:mod:`headwise.model.nystrom`), with an
optional depthwise convolution on the values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from headwise.model.attention import AttentionKind, Option, register_kind

if TYPE_CHECKING:
    from torch import Tensor, nn

    from headwise.model.cache import LayerCache
    from headwise.spec import LayerShape, ModelSpec


@register_kind
class NystromAttention(AttentionKind):
    """The Nyström approximation of bidirectional softmax attention. Analysis reads the exact
    softmax probabilities it stands for; landmarks are means of contiguous segments, so the
    outputs depend on the order of the positions (not ``reorderable``)."""

    name = "nystrom"
    options = {
        "landmarks": Option(int, 64, "nystrom layers: landmarks (segment means of q and k)", gt=0),
        "pinv_iterations": Option(int, 6, "nystrom layers: iterations of the pseudo-inverse", gt=0),
        "nystrom_conv": Option(int | None, None, "nystrom layers: the kernel of the depthwise convolution on "
                               "values (None: none)", gt=0),
        "pinv_init": Option(Literal["per_head", "original"], "per_head",
                            "nystrom layers: where the pseudo-inverse's start A^T / c takes its maximum c: per "
                            "sample and head, or once over the whole batch (the Nystromformer code's \"original\")"),
    }

    @staticmethod
    def check(spec: ModelSpec, used: bool) -> None:
        if used and spec.causal:
            raise ValueError("nystrom attention layers are bidirectional: set causal = false")
        if spec.nystrom_conv is not None and spec.nystrom_conv % 2 == 0:
            raise ValueError(f"nystrom_conv = {spec.nystrom_conv}: the convolution's kernel must be odd (it keeps "
                             "the length)")

    @staticmethod
    def params(spec: ModelSpec, shape: LayerShape) -> int:
        # the depthwise convolution on values: one kernel per head, no bias
        return shape.heads * spec.nystrom_conv if spec.nystrom_conv else 0

    @staticmethod
    def flops(spec: ModelSpec, shape: LayerShape, t: int) -> float:
        """With m landmarks: the two kernels against the landmarks, B v and F (Z B v) take
        4 t m width multiply-adds, Z (B v) m^2 width, and the pseudo-inverse's iterations 4 m^3
        each per head; the convolution, kernel x t x width."""
        m = min(spec.landmarks, t)
        mult_adds = shape.width * (4 * t * m + m * m) + shape.heads * 4 * spec.pinv_iterations * m**3
        if spec.nystrom_conv:
            mult_adds += spec.nystrom_conv * t * shape.width
        return 6 * mult_adds

    @staticmethod
    def build(attn: nn.Module, spec: ModelSpec, shape: LayerShape) -> None:
        from headwise.model.nystrom import NystromConv

        attn.landmarks, attn.pinv_iterations, attn.pinv_init = spec.landmarks, spec.pinv_iterations, spec.pinv_init
        attn.conv = NystromConv(shape.heads, spec.nystrom_conv) if spec.nystrom_conv else None

    @staticmethod
    def forward(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None, queries: int | None,
                key_mask: Tensor | None) -> Tensor:
        from headwise.model.kernels import repeat_kv
        from headwise.model.nystrom import nystrom_attention

        # grouped KV heads: the approximation (and the convolution, one kernel per head) reads
        # each query head's own copy of its group's keys and values
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        y = nystrom_attention(q, k, v, attn.landmarks, attn.scale, attn.pinv_iterations, key_mask=key_mask,
                              pinv_init=attn.pinv_init)
        if attn.conv is not None:
            y = y + attn.conv(v, key_mask)
        return y[:, :, :queries]
