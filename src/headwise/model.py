"""The transformer: every layer with its own head count and head width.

One file, nanoGPT style. With a uniform spec and GPT-Neo's options it is exactly Hugging Face's
``GPTNeoForCausalLM`` (see :mod:`headwise.hf`); ``vocab_size=None`` gives the same blocks as a
vector-in, vector-out encoder for synthetic tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from headwise.errors import HeadwiseError
from headwise.spec import LayerShape, ModelSpec

ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class UnitNorm(nn.Module):
    """``scale * x / ||x||`` with one learnable scalar (Amsel et al.'s replacement for LayerNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * F.normalize(x, dim=-1)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "unitnorm_post":
        return UnitNorm()
    return nn.LayerNorm(spec.d_model, eps=spec.layer_norm_eps)


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


def attention_mask(past: int, t: int, window: int | None, device: torch.device) -> Tensor:
    """Boolean mask (t x past+t): query ``past+i`` may see key ``j`` when j <= past+i and, for a
    local layer, j > past+i-window (GPT-Neo's convention: the token itself included)."""
    q = torch.arange(past, past + t, device=device)[:, None]
    k = torch.arange(past + t, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


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


def causal_attention_in_halves(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
                               dropout_p: float) -> Tensor:
    """Causal (or local-window) attention of a fresh sequence [B, heads, T, head_dim], computed
    for the first and second half of the queries separately; equal to one SDPA call."""
    t = q.shape[2]
    halves = []
    for start, end in ((0, t // 2), (t // 2, t)):
        first = 0 if window is None else max(0, start - window + 1)  # the first key any query here sees
        if start == 0 and (window is None or end <= window):
            mask, causal = None, True
        else:
            mask, causal = attention_mask(start - first, end - start, window, q.device), False
        y = F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, first:end], v[:, :, first:end],
                                           attn_mask=mask, is_causal=causal, dropout_p=dropout_p, scale=scale)
        halves.append(y.transpose(1, 2))
    # Joined as [B, T, heads, head_dim] (the layout SDPA writes), returned as [B, heads, T, head_dim]
    return torch.cat(halves, dim=1).transpose(1, 2)


class Attention(nn.Module):
    """All heads of a layer in one fused qkv projection and one SDPA call."""

    def __init__(self, spec: ModelSpec, shape: LayerShape) -> None:
        super().__init__()
        self.heads, self.head_dim, self.width = shape.heads, shape.head_dim, shape.width
        self.qkv = nn.Linear(spec.d_model, 3 * self.width, bias=spec.qkv_bias)
        self.out = nn.Linear(self.width, spec.d_model, bias=spec.out_bias)
        self.causal = spec.causal
        self.window = spec.window if shape.attention == "local" else None
        self.scale = 1.0 if spec.score_scale == "none" else self.head_dim**-0.5
        self.dropout = spec.dropout

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, self.head_dim)
        pad = 0
        if (cache is None and self.head_dim < CPU_MIN_HEAD_DIM and qkv.device.type == "cpu"
                and qkv.dtype == torch.float32):
            pad = CPU_MIN_HEAD_DIM - self.head_dim
            qkv = F.pad(qkv, (0, pad))
        # q, k, v are strided views of the projection [B, heads, T, head_dim]: SDPA reads them in place
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.extend(k, v)
        dropout_p = self.dropout if self.training else 0.0
        if (self.causal and past == 0 and x.device.type == "cpu"
                and CPU_SPLIT_QUERIES[0] < t <= CPU_SPLIT_QUERIES[1]):
            y = causal_attention_in_halves(q, k, v, self.window, self.scale, dropout_p)
        else:
            mask, is_causal = None, False
            if self.causal:
                # Only a local layer whose window is shorter than the keys needs a band mask (a
                # single new query just sees the last `window` keys); a single new query of a
                # global layer sees every key; a fresh sequence uses SDPA's own causal path.
                if self.window is not None and past + t > self.window:
                    if t == 1:
                        k, v = k[:, :, -self.window:], v[:, :, -self.window:]
                    else:
                        mask = attention_mask(past, t, self.window, x.device)
                elif past == 0:
                    is_causal = t > 1
                elif t > 1:
                    mask = attention_mask(past, t, None, x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p,
                                               scale=self.scale)
        if pad:
            y = y[..., : self.head_dim]
        # SDPA's output is laid out [B, T, heads, head_dim] in memory: unless padded, this reshape
        # copies nothing
        return self.out(y.transpose(1, 2).reshape(b, t, self.width))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, shape: LayerShape) -> None:
        super().__init__()
        self.fc = nn.Linear(spec.d_model, shape.mlp_hidden, bias=spec.mlp_bias)
        self.proj = nn.Linear(shape.mlp_hidden, spec.d_model, bias=spec.mlp_bias)
        self.act = ACTIVATIONS[spec.activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Attention and MLP with residuals; pre-norm (GPT-Neo) or post-norm (Amsel et al.)."""

    def __init__(self, spec: ModelSpec, shape: LayerShape) -> None:
        super().__init__()
        self.pre_norm = spec.norm == "layernorm_pre"
        self.norm1 = make_norm(spec)
        self.attn = Attention(spec, shape)
        self.norm2 = make_norm(spec)
        self.mlp = MLP(spec, shape)
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.norm1(x), cache))
            return x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, cache)))
        return self.norm2(x + self.drop(self.mlp(x)))


# Vocabulary sizes are padded to a multiple of this for the output matmul. With GPT-Neo's 50,257
# the logits' rows are not 64-byte aligned and the CPU GEMM writing them runs at ~2/3 of its peak
# (benchmarks/bench_kernels.py, float32, 1024 x 768 x 50,257, 2 cores, three runs: 122-130
# GFLOP/s into plain rows, 161-170 into padded ones).
VOCAB_PAD = 64


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


class Transformer(nn.Module):
    """A decoder LM (token ids -> logits) or, with ``vocab_size=None``, a vector encoder."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tok_emb = nn.Embedding(spec.vocab_size, d) if spec.vocab_size else None
        self.pos_emb = nn.Embedding(spec.max_seq_len, d) if spec.positions == "learned" else None
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec, shape) for shape in spec.layers())
        self.norm_f = nn.LayerNorm(d, eps=spec.layer_norm_eps) if spec.norm == "layernorm_pre" else nn.Identity()
        self.lm_head = None
        if spec.vocab_size:
            self.lm_head = nn.Linear(d, spec.vocab_size, bias=False)
            if spec.tie_embeddings:
                self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-Neo's initialisation: N(0, std) weights, zero biases, LayerNorm (1, 0).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.spec.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, inputs: Tensor, cache: KVCache | None = None, pad_vocab: bool = False) -> Tensor:
        """Logits [B, T, vocab] for token ids [B, T]; or vectors [B, N, d] for vectors [B, N, d].

        ``pad_vocab=True`` (what training uses) returns logits [B, T, V_pad] whose columns past
        the vocabulary are -inf, computed faster (see :data:`VOCAB_PAD`): softmax, cross-entropy
        and argmax over them equal those over the vocabulary. It does nothing without a vocabulary.
        """
        x = self.tok_emb(inputs) if self.tok_emb is not None else inputs
        t = x.shape[1]
        past = cache.length if cache is not None else 0
        if past + t > self.spec.max_seq_len:
            raise HeadwiseError(
                f"sequence of {past + t} positions is longer than the model's max_seq_len {self.spec.max_seq_len}"
            )
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(past, past + t, device=x.device))
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += t
        x = self.norm_f(x)
        if self.lm_head is None:
            return x
        return padded_logits(x, self.lm_head.weight) if pad_vocab else self.lm_head(x)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks))

    def num_params(self) -> int:
        """Trainable parameters, tied weights counted once."""
        return sum(p.numel() for p in self.parameters())


SPEC_FILE = "spec.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: Transformer, directory: str | Path) -> None:
    """Write ``model.safetensors`` and ``spec.json`` into ``directory``."""
    from headwise.config import atomic_write_text

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_model(model, str(tmp))
    tmp.replace(directory / WEIGHTS_FILE)
    atomic_write_text(directory / SPEC_FILE, json.dumps(model.spec.to_dict(), indent=2))


def load_pretrained(directory: str | Path, map_location: str | torch.device = "cpu") -> Transformer:
    """Build the model of ``spec.json`` and load ``model.safetensors``; they must agree."""
    directory = Path(directory)
    spec_path, weights_path = directory / SPEC_FILE, directory / WEIGHTS_FILE
    for p in (spec_path, weights_path):
        if not p.is_file():
            raise HeadwiseError(f"{p} is missing: {directory} is not a saved headwise model")
    spec = ModelSpec.parse(json.loads(spec_path.read_text()), source=str(spec_path))
    model = Transformer(spec)
    try:
        load_model(model, str(weights_path), strict=True, device=str(map_location))
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = next((line.strip() for line in first[1:] if line.strip()), first[0] if first else "")
        raise HeadwiseError(f"{weights_path} does not match {spec_path}: {detail}") from None
    return model
