"""The model's speed paths compute what the plain definitions compute: zero-padded narrow heads,
queries split in halves for 256 < T <= 512, the growing KV cache, single-token decoding through a
local window, and logits padded past the vocabulary."""

import pytest
import torch
import torch.nn.functional as F

from headwise.model import CPU_MIN_HEAD_DIM, CPU_SPLIT_QUERIES, VOCAB_PAD, LayerCache, Transformer
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


@pytest.mark.parametrize("window, attention", [(None, "global"), (7, "local"), (200, "local"), (400, "local")])
@pytest.mark.parametrize("head_dim", [4, 16])
def test_queries_split_in_halves_match_the_definition(window, attention, head_dim):
    torch.manual_seed(1)
    t = 301  # odd, inside the split range
    assert CPU_SPLIT_QUERIES[0] < t <= CPU_SPLIT_QUERIES[1]
    spec = ModelSpec(vocab_size=None, d_model=16, n_layers=1, heads=[2], head_dim=head_dim, attention=[attention],
                     window=window or 256, max_seq_len=512, score_scale="inv_sqrt")
    attn = Transformer(spec).blocks[0].attn
    x = torch.randn(2, t, 16, requires_grad=True)
    y = attn(x)
    ref = _reference_attention(x, attn, window)
    assert torch.allclose(y, ref, atol=1e-5)
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
@pytest.mark.parametrize("window, batch, prompt, length", [
    (5, 2, 3, 30),  # decoding far past a short window
    (64, 1, 300, 310),  # a 300-token prompt takes the split-queries path into the cache
])
def test_prompt_then_decoding_matches_the_full_forward(window, batch, prompt, length):
    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=50, d_model=24, n_layers=2, heads=[12, 3], attention=["local", "global"],
                     window=window, max_seq_len=512)
    model = Transformer(spec).eval()
    x = torch.randint(0, 50, (batch, length))
    full = model(x)
    cache = model.new_cache()
    steps = [model(x[:, :prompt], cache)] + [model(x[:, i:i + 1], cache) for i in range(prompt, length)]
    assert cache.length == length and cache.layers[0].length == length
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("vocab", [50, 64, 97])
@pytest.mark.parametrize("autocast", [False, True])
def test_padded_vocab_logits_give_the_loss_and_gradients_of_the_plain_head(vocab, autocast):
    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=vocab, d_model=32, n_layers=2, heads=[4, 2], max_seq_len=64)
    model = Transformer(spec)
    x, y = torch.randint(0, vocab, (3, 20)), torch.randint(0, vocab, (3, 20))
    results = []
    for pad in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x, pad_vocab=pad)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        results.append((logits, loss, [p.grad.clone() for p in model.parameters()]))
    (plain, loss, grads), (padded, loss_p, grads_p) = results
    assert padded.shape[-1] == -(-vocab // VOCAB_PAD) * VOCAB_PAD
    assert torch.isneginf(padded[..., vocab:]).all()
    tol = 1e-2 if autocast else 1e-6  # bf16: the two paths may round the casts' products differently
    assert padded.dtype == plain.dtype and torch.allclose(padded[..., :vocab].float(), plain.float(), atol=tol)
    assert torch.allclose(loss_p, loss, atol=tol)
    assert all(torch.allclose(a, b, atol=tol) for a, b in zip(grads_p, grads))
    # the weight tied to the embedding gets the head's gradient and the embedding's
    assert model.lm_head.weight is model.tok_emb.weight


@pytest.mark.parametrize("head_dim", [8, 16, 32, 64])
@pytest.mark.parametrize("t", [40, 301])  # one SDPA call, and queries split in halves
def test_narrow_bf16_heads_attended_in_fp32_are_no_less_exact(head_dim, t):
    # bf16 heads up to CPU_BF16_FP32_MAX_HEAD_DIM wide are attended in fp32 (faster on the CPU):
    # the output is bf16 as before, and no further from the float64 definition than the bf16
    # kernel's (within one bf16 rounding of it), forward and backward, under autocast too.
    from headwise.model.kernels import CPU_BF16_FP32_MAX_HEAD_DIM, attention

    torch.manual_seed(2)
    qkv = torch.randn(2, t, 3, 4, head_dim).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(2, 4, t, head_dim)

    def run(fn):
        x = qkv.detach().clone().requires_grad_()
        y = fn(x)
        (g,) = torch.autograd.grad((y.float() * weight).sum(), x)
        return y, g

    def definition(x):
        q, k, v = x.double().permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / head_dim**0.5
        return scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ v

    def bf16_kernel(x):
        q, k, v = x.permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    y, g = run(lambda x: attention(*x.permute(2, 0, 3, 1, 4), None, True, None, head_dim**-0.5, 0.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ac, g_ac = run(lambda x: attention(*x.permute(2, 0, 3, 1, 4), None, True, None, head_dim**-0.5, 0.0))
    ref, g_ref = run(definition)
    plain, g_plain = run(bf16_kernel)
    assert y.dtype == g.dtype == torch.bfloat16 and torch.equal(y, y_ac) and torch.equal(g, g_ac)
    for ours, bf16, exact in ((y, plain, ref), (g, g_plain, g_ref)):
        err, err_bf16 = (ours.double() - exact).abs().max(), (bf16.double() - exact).abs().max()
        assert err <= err_bf16 + 2.0**-8 * exact.abs().max()
    if head_dim <= CPU_BF16_FP32_MAX_HEAD_DIM:  # attended in fp32: only the final roundings to bf16
        assert (y.double() - ref).abs().max() <= 2.0**-8 * ref.abs().max()
