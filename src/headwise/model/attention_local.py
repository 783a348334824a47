"""``local`` attention (GPT-Neo's): causal softmax attention in which each position sees itself
and the ``window - 1`` positions before it. Decoding with a key/value cache keeps every position's
keys; a new position attends to the last ``window`` of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwise.model.attention import AttentionKind, Option, register_kind, softmax_attention

if TYPE_CHECKING:
    from torch import Tensor, device, nn

    from headwise.model.cache import LayerCache
    from headwise.spec import LayerShape, ModelSpec


@register_kind
class LocalAttention(AttentionKind):
    """Causal softmax attention over a window of ``window`` positions, the query's own included."""

    name = "local"
    options = {"window": Option(int, 256, "local layers: the positions each one sees, itself included", gt=0)}
    # Qwen3's sliding-window layers see the same keys: key j from query i when i - window < j <= i
    hf_names = {"gpt_neo": "local", "qwen3": "sliding_attention", "laguna": "sliding_attention"}
    hf_config = {"gpt_neo": {"window_size": "window"}, "qwen3": {"sliding_window": "window"},
                 "laguna": {"sliding_window": "window"}}

    @staticmethod
    def check(spec: ModelSpec, used: bool) -> None:
        if used and not spec.causal:
            kinds = spec.attention or []
            first = kinds.index(LocalAttention.name) if LocalAttention.name in kinds else 0
            raise ValueError(f"layer {first}: local attention layers need causal = true (a sliding window is "
                             "defined for decoders): set causal = true or make the layer global")

    @staticmethod
    def build(attn: nn.Module, spec: ModelSpec, shape: LayerShape) -> None:
        attn.window = spec.window

    @staticmethod
    def forward(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None, queries: int | None,
                key_mask: Tensor | None) -> Tensor:
        return softmax_attention(attn, q, k, v, cache, queries, key_mask, window=attn.window)

    @staticmethod
    def allowed_keys(attn: nn.Module, t: int, device: device) -> Tensor:
        from headwise.model.kernels import attention_mask

        return attention_mask(0, t, attn.window, device)

    @classmethod
    def label(cls, attn: nn.Module) -> str:
        return f"{cls.name}({attn.window})"

    @classmethod
    def describe(cls, spec: ModelSpec) -> str:
        return f"{cls.name} (window {spec.window})"
