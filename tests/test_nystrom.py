"""Nyström attention (headwise.model.nystrom) against transformers' NystromformerSelfAttention, against
exact softmax attention, with padding masks, and its gradients.

transformers' quirks met here (5.23): its config's ``conv_kernel_size`` must be an int (the conv
is always built; it is switched off below by setting the module's ``conv_kernel_size`` to None),
``inv_coeff_init_option=True`` raises ``TypeError: 'NystromformerConfig' object is not
subscriptable`` when the module is built (its non-"original" branch, our "per_head", is reached
by setting the module's ``init_option`` to any other string), and with as many landmarks as its
``segment_means_seq_len`` it computes exact softmax attention instead of the approximation.

``python tests/test_nystrom.py`` prints the forward + backward timings (no test asserts speed).
"""

import math
import statistics
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

from headwise.model.nystrom import NystromConv, iterative_pinv, nystrom_attention, nystrom_conv

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference")
from transformers import NystromformerConfig  # noqa: E402
from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention  # noqa: E402


def _hf_module(heads, head_dim, t, landmarks, init, conv):
    config = NystromformerConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_landmarks=landmarks,
                                 segment_means_seq_len=t, conv_kernel_size=conv or 3, attention_probs_dropout_prob=0.0)
    module = NystromformerSelfAttention(config).eval()
    module.init_option = init  # "original", or anything else for its per-head coefficient
    if conv is None:
        module.conv_kernel_size = None
    return module


def _ours_with_hf_weights(module, x, landmarks, init, conv):
    b, t, _ = x.shape
    heads, head_dim = module.num_attention_heads, module.attention_head_size
    q, k, v = (lin(x).view(b, t, heads, head_dim).transpose(1, 2) for lin in (module.query, module.key, module.value))
    out = nystrom_attention(q, k, v, landmarks, 1 / math.sqrt(head_dim), pinv_init=init)
    if conv is not None:
        helper = NystromConv(heads, conv)
        with torch.no_grad():
            helper.weight.copy_(module.conv.weight)
        out = out + helper(v)
    return out.transpose(1, 2).reshape(b, t, heads * head_dim)


def _qkv(b, heads, t, head_dim, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, heads, t, head_dim, generator=g, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize("heads,head_dim,t,landmarks", [(2, 32, 64, 8), (3, 16, 48, 16), (4, 8, 16, 1), (1, 8, 40, 20)])
@pytest.mark.parametrize("init", ["original", "per_head"])
@pytest.mark.parametrize("conv", [None, 5])
def test_matches_transformers(heads, head_dim, t, landmarks, init, conv):
    torch.manual_seed(0)
    module = _hf_module(heads, head_dim, t, landmarks, init, conv)
    x = torch.randn(3, t, heads * head_dim)
    with torch.no_grad():
        theirs = module(x)[0]
        ours = _ours_with_hf_weights(module, x, landmarks, init, conv)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)  # measured <= 3.6e-7


def test_original_init_shares_one_coefficient_across_the_batch():
    # The reason "per_head" is the default: with "original" a sample's output depends on its batch.
    q, k, v = _qkv(4, 2, 32, 8, seed=1)
    q[0] *= 3  # sample 0 gets peakier landmark scores, hence a different largest column sum
    for init, independent in [("per_head", True), ("original", False)]:
        together = nystrom_attention(q, k, v, 8, 8 ** -0.5, pinv_init=init)[1:]
        alone = nystrom_attention(q[1:], k[1:], v[1:], 8, 8 ** -0.5, pinv_init=init)
        assert torch.allclose(together, alone, atol=1e-6, rtol=0) == independent


def test_full_landmarks_against_transformers_exact_path():
    # With landmarks == T transformers computes exact softmax attention; we keep the approximation,
    # whose only error is then the pseudo-inverse's (measured max 0.017-0.023 here).
    module = _hf_module(1, 8, 32, 32, "per_head", None)
    x = torch.randn(3, 32, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = module(x)[0]
        q, k, v = (lin(x).view(3, 32, 1, 8).transpose(1, 2) for lin in (module.query, module.key, module.value))
        exact = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(3, 32, 8)
        ours = _ours_with_hf_weights(module, x, 32, "per_head", None)
    torch.testing.assert_close(theirs, exact, atol=1e-5, rtol=0)
    assert (ours - theirs).abs().max() < 0.1


def test_full_landmarks_is_softmax_attention_up_to_the_pseudo_inverse():
    # T = 64, landmarks = 64, head_dim 32, 5 random draws of [2, 2, 64, 32]: max abs error
    # 0.030-0.045 after 6 iterations, 0.0016-0.0020 after 10, < 1e-4 after 20.
    for seed in range(2):
        q, k, v = _qkv(1, 2, 64, 32, seed)
        exact = F.scaled_dot_product_attention(q, k, v)
        assert (nystrom_attention(q, k, v, 64, 32 ** -0.5) - exact).abs().max() < 0.1
        assert (nystrom_attention(q, k, v, 64, 32 ** -0.5, iterations=10) - exact).abs().max() < 0.005
        assert (nystrom_attention(q, k, v, 64, 32 ** -0.5, iterations=20) - exact).abs().max() < 1e-3


def test_error_against_softmax_attention_by_landmarks():
    # T = 256, head_dim 32, random q, k, v (exact outputs' std 0.10: random scores have no
    # low-rank structure, the approximation's worst case). Measured over 5 draws:
    #   landmarks  16: max 0.53-0.80, mean 0.059-0.061
    #   landmarks  64: max 0.49-0.68, mean 0.044-0.046
    #   landmarks 128: max 0.41-0.60, mean 0.036-0.038
    #   landmarks 256: max 0.041-0.046, mean 0.0074-0.0077
    q, k, v = _qkv(2, 2, 256, 32, seed=0)
    exact = F.scaled_dot_product_attention(q, k, v)
    errors = {m: (nystrom_attention(q, k, v, m, 32 ** -0.5) - exact).abs() for m in (16, 64, 256)}
    means = [errors[m].mean().item() for m in (16, 64, 256)]
    assert means[0] > means[1] > means[2]
    assert means[0] < 0.1 and means[2] < 0.015
    assert errors[16].max() < 1.5 and errors[64].max() < 1.5 and errors[256].max() < 0.1


@pytest.mark.parametrize("init", ["per_head", "original"])
def test_right_padded_batch_matches_unpadded_sequences(init):
    # Segments of 4 (24 positions, 6 landmarks): a sample of n real tokens run alone with
    # n / 4 landmarks has the same segments. With "original" only a batch of one is comparable.
    heads, head_dim, t, landmarks = 2, 8, 24, 6
    lengths = [24, 16, 8, 12] if init == "per_head" else [12]
    q, k, v = _qkv(len(lengths), heads, t, head_dim, seed=3)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    # Garbage in the padding must not matter.
    junk = ~mask[:, None, :, None]
    q, k, v = (x.masked_fill(junk, 1e3) for x in (q, k, v))
    out = nystrom_attention(q, k, v, landmarks, head_dim ** -0.5, key_mask=mask, pinv_init=init)
    assert torch.isfinite(out).all()
    for i, n in enumerate(lengths):
        alone = nystrom_attention(q[i:i + 1, :, :n], k[i:i + 1, :, :n], v[i:i + 1, :, :n], n // 4, head_dim ** -0.5,
                                  pinv_init=init)
        torch.testing.assert_close(out[i:i + 1, :, :n], alone, atol=1e-5, rtol=0)


def test_length_not_a_multiple_of_landmarks_pads_at_the_end():
    # T = 10, 4 landmarks: segments of 3, as if padded to 12 with masked positions.
    q, k, v = _qkv(2, 2, 10, 8, seed=4)
    out = nystrom_attention(q, k, v, 4, 0.3)
    assert out.shape == (2, 2, 10, 8)
    padded = [F.pad(x, (0, 0, 0, 2)) for x in (q, k, v)]
    mask = torch.arange(12)[None, :].expand(2, 12) < 10
    torch.testing.assert_close(out, nystrom_attention(*padded, 4, 0.3, key_mask=mask)[:, :, :10], atol=1e-6, rtol=0)
    # T = 10, 6 landmarks: segments of 2, the sixth one empty: the same as 5 landmarks.
    torch.testing.assert_close(nystrom_attention(q, k, v, 6, 0.3), nystrom_attention(q, k, v, 5, 0.3),
                               atol=1e-6, rtol=0)
    # More landmarks than tokens: segments of one token, the extra landmarks empty.
    torch.testing.assert_close(nystrom_attention(q, k, v, 13, 0.3), nystrom_attention(q, k, v, 10, 0.3),
                               atol=1e-6, rtol=0)


def test_empty_segment_inside_the_sequence_is_dropped():
    # Masking out a whole segment (positions 8-11 of 24, segments of 4) gives, at the real
    # positions, the sequence without those tokens with one landmark fewer.
    q, k, v = _qkv(1, 3, 24, 8, seed=5)
    mask = torch.ones(1, 24, dtype=torch.bool)
    mask[0, 8:12] = False
    keep = mask[0]
    out = nystrom_attention(q, k, v, 6, 0.35, key_mask=mask)
    cut = nystrom_attention(q[:, :, keep], k[:, :, keep], v[:, :, keep], 5, 0.35)
    torch.testing.assert_close(out[:, :, keep], cut, atol=1e-5, rtol=0)
    # A partly masked segment (position 11 is padding): its landmarks are means of its real tokens
    # only, so the padding's values change nothing at the real positions.
    mask[0, 8:11] = True
    keep = mask[0]
    out = nystrom_attention(q, k, v, 6, 0.35, key_mask=mask)
    wild = [x.clone() for x in (q, k, v)]
    for x in wild:
        x[:, :, 11] = 100.0
    torch.testing.assert_close(nystrom_attention(*wild, 6, 0.35, key_mask=mask)[:, :, keep], out[:, :, keep],
                               atol=1e-6, rtol=0)


def test_one_landmark_is_the_mean_of_the_real_queries():
    # With one landmark F, A and A's pseudo-inverse are all 1, so every output is B v: the
    # landmark's softmax attention over the real keys, the landmark the real queries' mean.
    q, k, v = _qkv(1, 2, 12, 8, seed=9)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, [3, 7, 11]] = False
    real = mask[0]
    landmark = q[:, :, real].mean(2, keepdim=True)                                       # [1, 2, 1, 8]
    weights = torch.softmax(0.3 * landmark @ k[:, :, real].transpose(-1, -2), dim=-1)    # [1, 2, 1, 9]
    expected = (weights @ v[:, :, real]).expand(1, 2, 9, 8)
    out = nystrom_attention(q, k, v, 1, 0.3, key_mask=mask)
    torch.testing.assert_close(out[:, :, real], expected, atol=1e-6, rtol=0)


def test_fully_masked_sample_stays_finite():
    q, k, v = _qkv(2, 2, 12, 4, seed=6)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1] = False
    out = nystrom_attention(q, k, v, 3, 0.5, key_mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:1], nystrom_attention(q[:1], k[:1], v[:1], 3, 0.5), atol=1e-6, rtol=0)


def test_strided_views_from_a_fused_projection():
    qkv = torch.randn(2, 20, 3, 2, 8, generator=torch.Generator().manual_seed(7))
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, heads, T, head_dim] views
    expected = nystrom_attention(q.contiguous(), k.contiguous(), v.contiguous(), 5, 0.3)
    torch.testing.assert_close(nystrom_attention(q, k, v, 5, 0.3), expected, atol=0, rtol=0)


def test_half_precision_close_to_float32():
    q, k, v = _qkv(1, 2, 64, 16, seed=8)
    ref = nystrom_attention(q, k, v, 8, 0.25)
    out = nystrom_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 8, 0.25)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05


def test_gradcheck():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 1, 5, 2, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for kwargs in [dict(landmarks=5), dict(landmarks=2, key_mask=mask), dict(landmarks=2, pinv_init="original")]:
        landmarks = kwargs.pop("landmarks")
        assert torch.autograd.gradcheck(lambda a, b, c: nystrom_attention(a, b, c, landmarks, 0.5, **kwargs), (q, k, v))
    weight = torch.randn(1, 1, 3, 1, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: nystrom_conv(a, w, mask), (v, weight))


def test_iterative_pinv_converges():
    a = torch.softmax(torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(10), dtype=torch.float64), -1)
    z = iterative_pinv(a, 30)
    torch.testing.assert_close(z, torch.linalg.inv(a), atol=1e-8, rtol=1e-8)


def test_conv_matches_transformers_layout_and_ignores_padding():
    conv = NystromConv(3, 5)
    torch.nn.init.normal_(conv.weight)
    reference = torch.nn.Conv2d(3, 3, (5, 1), padding=(2, 0), groups=3, bias=False)
    with torch.no_grad():
        reference.weight.copy_(conv.weight)
    v = torch.randn(2, 3, 10, 4)
    torch.testing.assert_close(conv(v), reference(v))
    mask = torch.arange(10)[None, :] < torch.tensor([[10], [6]])
    out = conv(v.masked_fill(~mask[:, None, :, None], 7.0), mask)
    torch.testing.assert_close(out[1:, :, :6], conv(v[1:, :, :6]))
    with pytest.raises(ValueError, match="odd kernel_size"):
        NystromConv(3, 4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(landmarks=0), "landmarks"),
    (dict(landmarks=2.0), "landmarks"),
    (dict(iterations=-1), "iterations"),
    (dict(pinv_init="exact"), "pinv_init"),
    (dict(key_mask=torch.ones(2, 8)), "key_mask"),
    (dict(key_mask=torch.ones(2, 7, dtype=torch.bool)), "key_mask"),
])
def test_bad_arguments(kwargs, match):
    q, k, v = _qkv(2, 2, 8, 4, seed=11)
    kwargs = {"landmarks": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        nystrom_attention(q, k, v, scale=0.5, **kwargs)
    with pytest.raises(ValueError, match="head_dim"):
        nystrom_attention(q, k[:, :, :4], v, 4, 0.5)


def _median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(lengths=(1024, 2048, 4096), heads=2, head_dim=32, landmarks=64, repeats=15):
    """Forward + backward seconds (median of ``repeats``) on one thread: our function alone and
    after transformers' module's own q/k/v projections ("+proj"), the module itself (conv off,
    its projections included) and F.scaled_dot_product_attention alone."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"B=1 heads={heads} head_dim={head_dim} landmarks={landmarks}, 1 thread, median of {repeats}")
    for t in lengths:
        q, k, v = (x.requires_grad_() for x in _qkv(1, heads, t, head_dim, seed=0))
        module = _hf_module(heads, head_dim, t, landmarks, "original", None).train()
        x = torch.randn(1, t, heads * head_dim, requires_grad=True)

        def ours():
            nystrom_attention(q, k, v, landmarks, head_dim ** -0.5).sum().backward()

        def ours_with_projections():  # transformers' own query/key/value layers, then ours
            qq, kk, vv = (lin(x).view(1, t, heads, head_dim).transpose(1, 2)
                          for lin in (module.query, module.key, module.value))
            nystrom_attention(qq, kk, vv, landmarks, head_dim ** -0.5, pinv_init="original").sum().backward()

        def theirs():
            module(x)[0].sum().backward()

        def sdpa():
            F.scaled_dot_product_attention(q, k, v).sum().backward()

        row = {name: _median_seconds(fn, repeats) for name, fn in
               [("ours", ours), ("ours+proj", ours_with_projections), ("transformers+proj", theirs), ("sdpa", sdpa)]}
        print(f"T={t}: " + ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in row.items()))


if __name__ == "__main__":
    bench()
