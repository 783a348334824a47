"""The attention kernel (:func:`headwise.model.kernels.attention`) on every CPU path, against
SDPA on each key/value head repeated for the query heads it serves."""

from __future__ import annotations

import pytest
import torch

from helpers import one_thread  # noqa: F401  (one torch thread for this module)


@pytest.mark.parametrize("head_dim", [8, 64])  # 8: the CPU kernel's zero-padded narrow heads
@pytest.mark.parametrize("t", [40, 300])  # 300: the causal queries split in halves
@pytest.mark.parametrize("window", [None, 7])
def test_grouped_kv_heads_attend_as_their_repeated_copies(head_dim, t, window):
    # every CPU path of kernels.attention, with 6 query heads over 2 KV heads, against SDPA on
    # each KV head repeated for its 3 query heads (transformers' repeat_kv); then decoding a step
    # against a cache that holds the 2 KV heads
    import torch.nn.functional as F

    from headwise.model.cache import LayerCache
    from headwise.model.kernels import attention, attention_mask, repeat_kv

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, h, t + 1, head_dim, generator=g) for h in (6, 2, 2))
    scale = head_dim**-0.5
    got = attention(q[:, :, :t], k[:, :, :t], v[:, :, :t], None, True, window, scale, 0.0)
    mask = attention_mask(0, t + 1, window, q.device)
    want = F.scaled_dot_product_attention(q, repeat_kv(k, 6), repeat_kv(v, 6), attn_mask=mask, scale=scale)
    torch.testing.assert_close(got, want[:, :, :t], rtol=1e-5, atol=1e-6)
    cache = LayerCache()
    attention(q[:, :, :t], k[:, :, :t], v[:, :, :t], cache, True, window, scale, 0.0)
    step = attention(q[:, :, t:], k[:, :, t:], v[:, :, t:], cache, True, window, scale, 0.0)
    assert cache.k.shape == (2, 2, t + 1, head_dim)
    torch.testing.assert_close(step, want[:, :, t:], rtol=1e-5, atol=1e-6)
