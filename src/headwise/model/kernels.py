"""How attention and output logits are computed: one fused SDPA call per layer, and the CPU
kernel workarounds that make it fast.

Each workaround computes exactly what the plain definition computes (tests in
``tests/test_bench_model_speed.py``); the comments give the measurement that justifies it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from headwise.model.cache import LayerCache

# PyTorch's CPU flash-attention kernel is much slower per score for float32 heads narrower than
# 16 (measured with torch 2.13 on AVX-512: 96 heads of width 8 take 1.5x the time of the same
# heads zero-padded to 16, 128 heads of 6 take 1.65x). Zero columns change no score and no output,
# so such heads are padded to this width for the kernel and cut back after it.
CPU_MIN_HEAD_DIM = 16
# The same kernel scores each query block against whole 512-key blocks up to its diagonal, so for
# a causal sequence of up to 512 it computes the full T x T square and masks half of it away.
# Splitting such a sequence's queries in two halves, each scored only against the keys it may
# see, skips a quarter of the square (measured at T = 512: 20% less attention time in float32 on
# 2 threads, 10% in bfloat16). Longer sequences already skip whole key blocks.
CPU_SPLIT_QUERIES = (256, 512)  # split when CPU_SPLIT_QUERIES[0] < T <= CPU_SPLIT_QUERIES[1]
# The same kernel in bfloat16 is slower than in float32 for narrow heads: its per-head work does
# not shrink with the width (measured with torch 2.13 on a 2-core Xeon with AMX, one layer's
# causal attention forward + backward, B = 2, T = 512, one thread, process time, 5 rounds:
# 96 heads of 8: 204 ms bf16, 123 ms fp32; 48 of 16: 112 vs 78; 24 of 32: 68 vs 61; 12 of 64:
# 42 vs 56; 6 of 128: 34 vs 48). So under bf16, heads up to this width are attended in float32
# (which only adds precision: the scores and softmax are exact to fp32, the output is bf16 again).
CPU_BF16_FP32_MAX_HEAD_DIM = 32

# Vocabulary sizes are padded to a multiple of this for the output matmul. With GPT-Neo's 50,257
# the logits' rows are not 64-byte aligned and the CPU GEMM writing them runs at ~2/3 of its peak
# (benchmarks/bench_kernels.py, float32, 1024 x 768 x 50,257, 2 cores, three runs: 122-130
# GFLOP/s into plain rows, 161-170 into padded ones).
VOCAB_PAD = 64


def attention_mask(past: int, t: int, window: int | None, device: torch.device) -> Tensor:
    """Boolean mask (t x past+t): query ``past+i`` may see key ``j`` when j <= past+i and, for a
    local layer, j > past+i-window (GPT-Neo's convention: the token itself included)."""
    q = torch.arange(past, past + t, device=device)[:, None]
    k = torch.arange(past + t, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


def attention(q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None, causal: bool, window: int | None,
              scale: float, dropout_p: float, queries: int | None = None, key_mask: Tensor | None = None) -> Tensor:
    """All heads' attention outputs [B, heads, T, head_dim] of q [B, heads, T, head_dim] and k, v
    [B, kv_heads, T, head_dim]: causal (``window``: local) or bidirectional, scores times
    ``scale``. With fewer key/value heads than query heads, each KV head serves ``heads /
    kv_heads`` consecutive query heads (grouped-query attention: SDPA's ``enable_gqa``, which reads
    each KV head once instead of a repeated copy: measured with torch 2.13 on 2 cores, one thread,
    8 query and 2 KV heads of 64, B = 4: a decoding step over 512 cached keys 0.18 ms against
    0.77 ms repeated, training at T = 256 16 ms against 19 ms). With a ``cache`` the new keys and
    values (the KV heads alone) are appended to it and the queries attend to the cached positions
    too. ``queries``: only the first this many positions' outputs [B, heads, queries, head_dim],
    attending to every key; ``key_mask`` [B, T]: keys where it is False get no weight (both for
    bidirectional layers without a cache only)."""
    if (queries is not None or key_mask is not None) and (causal or cache is not None):
        raise ValueError("attention for the first positions only, or with a key mask, is for bidirectional layers "
                         "without a cache")
    past = 0 if cache is None else cache.length
    if cache is not None:
        cached_k, cached_v = cache.extend(k, v)
        if past:
            return _after_cached(q, cached_k, cached_v, past, causal, window, scale, dropout_p)
        # a fresh sequence attends to its own keys as they came: exactly what no cache computes
        # (so a prefill's logits equal a plain forward's to the bit)
    if queries is not None:
        q = q[:, :, :queries]
    mask = None if key_mask is None else key_mask[:, None, None, :]
    return sdpa(q, k, v, scale, dropout_p, causal, window, mask)


def _after_cached(q: Tensor, k: Tensor, v: Tensor, past: int, causal: bool, window: int | None, scale: float,
                  dropout_p: float) -> Tensor:
    """The attention of new queries at positions ``past ..`` to every key so far, ``past`` of them
    cached (one plain SDPA call: the CPU workarounds would copy the whole cache at every step)."""
    t, mask = q.shape[2], None
    # Only a local layer whose window is shorter than the keys needs a band mask (a single new
    # query just sees the last `window` keys); a single new query of a global layer sees every key.
    if causal and window is not None and past + t > window:
        if t == 1:
            k, v = k[:, :, -window:], v[:, :, -window:]
        else:
            mask = attention_mask(past, t, window, q.device)
    elif causal and t > 1:
        mask = attention_mask(past, t, None, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, dropout_p: float, causal: bool = False,
         window: int | None = None, mask: Tensor | None = None) -> Tensor:
    """``F.scaled_dot_product_attention`` of a fresh sequence (no cached keys), q [B, heads, Tq,
    head_dim] against k, v [B, kv_heads, T, head_dim] (grouped-query where kv_heads < heads):
    ``causal``, query i sees keys i - window < j <= i (``window`` None: j <= i); otherwise every
    key ``mask`` allows. On the CPU with the workarounds above, each computing exactly what the
    plain call computes."""
    head_dim, dtype, t = q.shape[-1], q.dtype, k.shape[2]
    cpu = q.device.type == "cpu"
    upcast = cpu and dtype == torch.bfloat16 and head_dim <= CPU_BF16_FP32_MAX_HEAD_DIM
    pad = CPU_MIN_HEAD_DIM - head_dim if cpu and (upcast or dtype == torch.float32) else 0
    gqa = k.shape[1] != q.shape[1]
    with torch.autocast("cpu", enabled=False) if upcast else nullcontext():  # autocast would run SDPA in bf16 again
        if upcast:
            q, k, v = q.float(), k.float(), v.float()
        if pad > 0:
            # q, k, v are strided views of the projection: SDPA reads them in place unless padded
            q, k, v = (F.pad(x, (0, pad)) for x in (q, k, v))
        if causal and cpu and CPU_SPLIT_QUERIES[0] < t <= CPU_SPLIT_QUERIES[1]:
            y = causal_attention_in_halves(q, k, v, window, scale, dropout_p, gqa)
        else:
            band = causal and window is not None and t > window  # a fresh sequence's local window
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(0, t, window, q.device) if band
                                               else mask, is_causal=causal and not band and t > 1,
                                               dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
    if pad > 0:
        y = y[..., :head_dim]
    return y.to(dtype)


def causal_attention_in_halves(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
                               dropout_p: float, enable_gqa: bool = False) -> Tensor:
    """Causal (or local-window) attention of a fresh sequence [B, heads, T, head_dim], computed
    for the first and second half of the queries separately (see :data:`CPU_SPLIT_QUERIES`);
    equal to one SDPA call (``enable_gqa``: k and v have fewer heads, see :func:`attention`)."""
    t = q.shape[2]
    halves = []
    for start, end in ((0, t // 2), (t // 2, t)):
        first = 0 if window is None else max(0, start - window + 1)  # the first key any query here sees
        if start == 0 and (window is None or end <= window):
            mask, causal = None, True
        else:
            mask, causal = attention_mask(start - first, end - start, window, q.device), False
        y = F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, first:end], v[:, :, first:end],
                                           attn_mask=mask, is_causal=causal, dropout_p=dropout_p, scale=scale,
                                           enable_gqa=enable_gqa)
        halves.append(y.transpose(1, 2))
    # Joined as [B, T, heads, head_dim] (the layout SDPA writes), returned as [B, heads, T, head_dim]
    return torch.cat(halves, dim=1).transpose(1, 2)


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """k or v [B, kv_heads, T, head_dim] with each KV head repeated for the query heads it serves,
    [B, heads, T, head_dim] (for computations without SDPA's grouped-query path: the Nyström
    approximation, analysis)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def padded_vocab_size(vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of :data:`VOCAB_PAD`."""
    return -(-vocab_size // VOCAB_PAD) * VOCAB_PAD


class _PaddedLogits(torch.autograd.Function):
    """``h @ W.T`` written into rows of :func:`padded_vocab_size` columns, the extra
    columns set to -inf: a softmax over them is the softmax over the vocabulary."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor) -> Tensor:
        v = weight.shape[0]
        out = h.new_empty(h.shape[0], padded_vocab_size(v))
        torch.mm(h, weight.t(), out=out[:, :v])
        out[:, v:] = float("-inf")
        ctx.save_for_backward(h, weight)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        h, weight = ctx.saved_tensors
        grad = grad[:, : weight.shape[0]]  # the padding's gradient is zero (its softmax is zero)
        return grad @ weight, grad.t() @ h


def padded_logits(h: Tensor, weight: Tensor) -> Tensor:
    """Logits ``[..., V_pad]`` of hidden states ``[..., d]`` against an output matrix ``[V, d]``,
    the columns past V being -inf (see :data:`VOCAB_PAD`). Under autocast the matmul runs in the
    autocast dtype, as ``F.linear`` would."""
    lead = h.shape[:-1]
    if torch.compiler.is_compiling():  # the compiler picks its own layouts: the plain path
        logits = F.linear(h, weight)
        v = weight.shape[0]
        return F.pad(logits, (0, padded_vocab_size(v) - v), value=float("-inf"))
    device = h.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        h, weight = h.to(dtype), weight.to(dtype)
    with torch.autocast(device, enabled=False):
        out = _PaddedLogits.apply(h.reshape(-1, h.shape[-1]), weight)
    return out.view(*lead, out.shape[-1])
