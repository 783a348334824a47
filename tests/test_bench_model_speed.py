"""The model's speed paths compute what the plain definitions compute: zero-padded narrow heads,
the growing KV cache, and single-token decoding through a local window."""

import pytest
import torch

from headwise.model import CPU_MIN_HEAD_DIM, LayerCache, Transformer
from headwise.spec import ModelSpec


def _reference_attention(x, attn, window):
    # Scores, mask and softmax written out, per head, in float64.
    b, t, _ = x.shape
    qkv = attn.qkv(x).double().view(b, t, 3, attn.heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv
    i = torch.arange(t)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed &= i[None, :] > i[:, None] - window
    scores = (q @ k.transpose(-1, -2)) * attn.scale
    y = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return attn.out(y.transpose(1, 2).reshape(b, t, attn.width).float())


@pytest.mark.parametrize("heads, head_dim", [(12, 2), (6, 4), (3, 8), (4, 12), (2, 16)])
@pytest.mark.parametrize("kind", ["global", "local"])
def test_narrow_heads_padded_for_the_kernel_match_the_definition(heads, head_dim, kind):
    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=None, d_model=24, n_layers=1, heads=[heads], head_dim=head_dim,
                     attention=[kind], window=7, score_scale="inv_sqrt")
    attn = Transformer(spec).blocks[0].attn
    assert (attn.head_dim < CPU_MIN_HEAD_DIM) == (head_dim < 16)
    x = torch.randn(2, 19, 24, requires_grad=True)
    y = attn(x)
    ref = _reference_attention(x, attn, 7 if kind == "local" else None)
    assert torch.allclose(y, ref, atol=1e-5)
    # and the gradients flowing back through the padding
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    assert torch.allclose(g, g_ref, atol=1e-4)


def test_layer_cache_grows_by_doubling_and_returns_views():
    cache = LayerCache()
    chunks = [torch.randn(2, 3, n, 4) for n in (5, 1, 1, 20, 1)]
    seen = []
    with torch.no_grad():
        for c in chunks:
            k, _ = cache.extend(c, -c)
            seen.append(cache._k.shape[2])
            assert torch.equal(k, torch.cat(chunks[: len(seen)], dim=2))
    assert cache.length == 28 and cache.v.shape == (2, 3, 28, 4) and torch.equal(cache.v, -cache.k)
    # at least 16; when full, max(needed, twice the cached length): 27 = 7 + 20, then 54 = 2 * 27
    assert seen == [16, 16, 16, 27, 54]
    assert cache.k.data_ptr() == cache._k.data_ptr()  # a view of the buffer, not a copy


def test_layer_cache_keeps_autograd_when_keys_need_grad():
    cache = LayerCache()
    a = torch.randn(1, 2, 3, 4, requires_grad=True)
    b = torch.randn(1, 2, 1, 4, requires_grad=True)
    cache.extend(a, a)
    k, v = cache.extend(b, b)
    (k.sum() + 2 * v.sum()).backward()
    assert torch.equal(a.grad, torch.full_like(a, 3.0)) and torch.equal(b.grad, torch.full_like(b, 3.0))


@torch.no_grad()
def test_decoding_past_the_window_matches_the_full_forward():
    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=50, d_model=24, n_layers=2, heads=[12, 3], attention=["local", "global"],
                     window=5, max_seq_len=64)
    model = Transformer(spec).eval()
    x = torch.randint(0, 50, (2, 30))
    full = model(x)
    cache = model.new_cache()
    steps = [model(x[:, :3], cache)] + [model(x[:, i:i + 1], cache) for i in range(3, 30)]
    assert cache.length == 30 and cache.layers[0].length == 30
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
