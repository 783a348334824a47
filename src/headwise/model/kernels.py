"""How attention and output logits are computed: one fused SDPA call per layer, and the CPU
kernel workarounds that make it fast.

Each workaround computes exactly what the plain definition computes (tests in
``tests/test_bench_model_speed.py``); the comments give the measurement that justifies it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Union

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from headwise.model.cache import LayerCache

#: What a layer hands its kind: the fused projection [B, T, 3, heads, head_dim], or q
#: [B, heads, T, head_dim] and k, v [B, kv_heads, T, head_dim] where the layer has fewer KV heads,
#: RoPE or q/k norms (:class:`headwise.model.transformer.Attention`)
QKV = Union[Tensor, tuple[Tensor, Tensor, Tensor]]

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


def attention(qkv: QKV, cache: LayerCache | None, causal: bool, window: int | None, scale: float,
              dropout_p: float, queries: int | None = None, key_mask: Tensor | None = None) -> Tensor:
    """All heads' attention outputs [B, heads, T, head_dim] from a fused projection
    ``qkv`` [B, T, 3, heads, head_dim], or from q, k, v (see :data:`QKV`): causal (``window``:
    local) or bidirectional, scores times ``scale``. With fewer key/value heads than query heads,
    each KV head serves ``heads / kv_heads`` consecutive query heads (grouped-query attention:
    SDPA's ``enable_gqa``, which reads each KV head once instead of a repeated copy: measured with
    torch 2.13 on 2 cores, one thread, 8 query and 2 KV heads of 64, B = 4: a decoding step over 512
    cached keys 0.18 ms against 0.77 ms repeated, training at T = 256 16 ms against 19 ms). With a
    ``cache`` the new keys and values (the KV heads alone) are appended to it and the queries attend
    to the cached positions too. ``queries``: only the first this many positions' outputs
    [B, heads, queries, head_dim], attending to every key; ``key_mask`` [B, T]: keys where it is
    False get no weight (both for bidirectional layers without a cache only)."""
    if (queries is not None or key_mask is not None) and (causal or cache is not None):
        raise ValueError("attention for the first positions only, or with a key mask, is for bidirectional layers "
                         "without a cache")
    if cache is not None and cache.length == 0:
        # A fresh sequence attends only to its own keys: cache them, then compute exactly what the
        # model computes without a cache (so a prefill's logits equal a plain forward's to the bit;
        # the cached path below skips the CPU workarounds and rounds differently)
        cache.extend(*split_qkv(qkv)[1:])
        return attention(qkv, None, causal, window, scale, dropout_p)
    first = qkv if isinstance(qkv, Tensor) else qkv[0]
    t = qkv.shape[1] if isinstance(qkv, Tensor) else first.shape[2]
    head_dim, device, dtype = first.shape[-1], first.device.type, first.dtype
    if cache is None and device == "cpu" and dtype == torch.bfloat16 and head_dim <= CPU_BF16_FP32_MAX_HEAD_DIM:
        with torch.autocast("cpu", enabled=False):  # autocast would run SDPA in bf16 again
            y = attention(_each(qkv, Tensor.float), None, causal, window, scale, dropout_p, queries, key_mask)
        return y.to(torch.bfloat16)
    pad = 0
    if cache is None and head_dim < CPU_MIN_HEAD_DIM and device == "cpu" and dtype == torch.float32:
        pad = CPU_MIN_HEAD_DIM - head_dim
        qkv = _each(qkv, lambda x: F.pad(x, (0, pad)))
    # q, k, v are strided views of the projection [B, heads, T, head_dim]: SDPA reads them in place
    q, k, v = split_qkv(qkv)
    gqa = k.shape[1] != q.shape[1]
    if queries is not None:
        q = q[:, :, :queries]
    past = 0
    if cache is not None:
        past = cache.length
        k, v = cache.extend(k, v)
    if causal and past == 0 and q.device.type == "cpu" and CPU_SPLIT_QUERIES[0] < t <= CPU_SPLIT_QUERIES[1]:
        y = causal_attention_in_halves(q, k, v, window, scale, dropout_p, gqa)
    else:
        mask, is_causal = (None if key_mask is None else key_mask[:, None, None, :]), False
        if causal:
            # Only a local layer whose window is shorter than the keys needs a band mask (a
            # single new query just sees the last `window` keys); a single new query of a
            # global layer sees every key; a fresh sequence uses SDPA's own causal path.
            if window is not None and past + t > window:
                if t == 1:
                    k, v = k[:, :, -window:], v[:, :, -window:]
                else:
                    mask = attention_mask(past, t, window, q.device)
            elif past == 0:
                is_causal = t > 1
            elif t > 1:
                mask = attention_mask(past, t, None, q.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p,
                                           scale=scale, enable_gqa=gqa)
    return y[..., :head_dim] if pad else y


def _each(qkv: QKV, fn: Callable[[Tensor], Tensor]) -> QKV:
    """``fn`` of the fused projection, or of each of q, k, v."""
    return fn(qkv) if isinstance(qkv, Tensor) else tuple(fn(x) for x in qkv)


class _SplitQKV(torch.autograd.Function):
    """q, k, v [B, heads, T, head_dim] as views of a fused projection [B, T, 3, heads, head_dim],
    whose gradient is written straight into one tensor of the projection's layout.

    Autograd's own backward of ``qkv.permute(...).unbind(0)`` stacks the three gradients SDPA
    returns into a new [3, B, heads, T, head_dim] tensor and then copies that into the
    projection's [B, T, 3, heads, head_dim] layout for its matmul: two passes over the gradient
    where one suffices (measured on the 6-layer, d 192 ViT of ``headwise bench --only vision``,
    B = 32, one thread: the stack and its copy took 7.5 ms of a 640 ms step, 1.2%)."""

    @staticmethod
    def forward(ctx, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ctx.shape = qkv.shape
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    @staticmethod
    def backward(ctx, gq: Tensor | None, gk: Tensor | None, gv: Tensor | None) -> Tensor:
        ref = next(g for g in (gq, gk, gv) if g is not None)
        grad = ref.new_empty(ctx.shape)
        for i, g in enumerate((gq, gk, gv)):
            if g is None:
                grad[:, :, i].zero_()
            else:
                grad[:, :, i].copy_(g.transpose(1, 2))
        return grad


def split_qkv(qkv: QKV) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [B, heads, T, head_dim]: strided views of a fused projection [B, T, 3, heads,
    head_dim] (see :class:`_SplitQKV` for their gradient); q, k, v given apart, as they are."""
    if not isinstance(qkv, Tensor):
        return qkv
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and qkv.requires_grad):
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # the compiler picks its own layouts
    return _SplitQKV.apply(qkv)


def causal_attention_in_halves(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
                               dropout_p: float, enable_gqa: bool = False) -> Tensor:
    """Causal (or local-window) attention of a fresh sequence [B, heads, T, head_dim], computed
    for the first and second half of the queries separately; equal to one SDPA call
    (``enable_gqa``: k and v have fewer heads, see :func:`attention`)."""
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
