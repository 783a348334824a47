"""An independent OpenELM, the reference headwise's OpenELM conversion is checked against.

OpenELM is remote code (corenet's ``general_gpt``, the hub's ``modeling_openelm.py``), not part of
``transformers``, and corenet is not importable here. This module is therefore a
re-implementation, written for the tests from corenet's ``GPTConfig.__post_init__``,
``MultiHeadCausalAttention``, ``FeedForwardNetwork``, ``TransformerDecoderLayer`` and
``make_divisible`` (apple/corenet, ``corenet/modeling/models/language_modeling/general_gpt.py``):
its own rounding (``round(v, 2)`` of numpy's ``linspace`` values; one multiplier unrounded), its
own defaults for absent fields (untied, no q/k norms), its own fused ``qkv_proj`` / ``proj_1``
layouts and module names (the untied output layer ``classifier``), its own KV cache (keys cached
after ``k_norm`` and before RoPE, the whole key sequence rotated at every step, as OpenELM does).
It shares no code with headwise.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# corenet's gpt_configs for the four OpenELM sizes (shared fields: num_gqa_groups 4,
# ffn_multipliers (0.5, 4.0), qkv_multipliers (0.5, 1.0), ffn_dim_divisor 256)
OPENELM_SIZES = {"270M": (16, 1280, 64), "450M": (20, 1536, 64), "1_1B": (28, 2048, 64), "3B": (36, 3072, 128)}


def _make_divisible(v: float, divisor: int) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _multipliers(value: float | tuple[float, float], n: int) -> list[float]:
    """corenet's per-layer multipliers: two values ramped and rounded, one value as it is."""
    if isinstance(value, (int, float)):
        return [value] * n
    return [round(v, 2) for v in np.linspace(*value, num=n, dtype=float)]


def reference_shapes(cfg: dict) -> dict:
    """OpenELM's per-layer query heads, KV heads and FFN inner widths for a corenet-style config."""
    n, d, hd, g = cfg["num_transformer_layers"], cfg["model_dim"], cfg["head_dim"], cfg.get("num_gqa_groups", 1)
    qkv, ffn = _multipliers(cfg.get("qkv_multipliers", 1.0), n), _multipliers(cfg.get("ffn_multipliers", 4.0), n)
    q = [int(_make_divisible(d * m, hd * g)) // hd for m in qkv]
    return {"q": q, "kv": [h // g for h in q], "ffn": [int(_make_divisible(m * d, cfg.get("ffn_dim_divisor", 256)))
                                                      for m in ffn]}


def size_shapes(size: str) -> dict:
    """The per-layer shapes of one of OpenELM's four sizes (a key of ``OPENELM_SIZES``)."""
    n, d, hd = OPENELM_SIZES[size]
    return reference_shapes(dict(num_transformer_layers=n, model_dim=d, head_dim=hd, num_gqa_groups=4,
                                 qkv_multipliers=(0.5, 1.0), ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=256))


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(n))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def _rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    half1, half2 = x.float().chunk(2, dim=-1)
    return (x.float() * emb.cos() + torch.cat([-half2, half1], dim=-1) * emb.sin()).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: dict, q: int, kv: int) -> None:
        super().__init__()
        d, self.hd, self.q, self.kv = cfg["model_dim"], cfg["head_dim"], q, kv
        self.theta = cfg.get("rope_freq_constant", 10000)
        self.qkv_proj = nn.Linear(d, (q + 2 * kv) * self.hd, bias=False)
        normed = cfg.get("normalize_qk_projections", False)
        self.q_norm, self.k_norm = (RMSNorm(self.hd), RMSNorm(self.hd)) if normed else (None, None)
        self.out_proj = nn.Linear(q * self.hd, d, bias=False)

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, t, _ = x.shape
        qkv = self.qkv_proj(x).reshape(b, t, self.q + 2 * self.kv, self.hd).transpose(1, 2)
        queries, keys, values = qkv.split([self.q, self.kv, self.kv], dim=1)
        if self.q_norm is not None:
            queries, keys = self.q_norm(queries), self.k_norm(keys)
        if past is not None:
            keys, values = torch.cat([past[0], keys], dim=-2), torch.cat([past[1], values], dim=-2)
        cache = (keys, values)
        s = keys.shape[-2]
        queries = _rope(queries, torch.arange(s - t, s), self.theta)
        keys = _rope(keys, torch.arange(s), self.theta)
        keys = keys.repeat_interleave(self.q // self.kv, dim=1)
        values = values.repeat_interleave(self.q // self.kv, dim=1)
        y = F.scaled_dot_product_attention(queries, keys, values, is_causal=past is None)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.q * self.hd)), cache


class FFN(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.proj_1, self.proj_2 = nn.Linear(d, 2 * inner, bias=False), nn.Linear(inner, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        y_1, y_2 = self.proj_1(x).chunk(2, dim=-1)
        return self.proj_2(F.silu(y_1) * y_2)


class Layer(nn.Module):
    def __init__(self, cfg: dict, q: int, kv: int, inner: int) -> None:
        super().__init__()
        self.attn, self.ffn = Attention(cfg, q, kv), FFN(cfg["model_dim"], inner)
        self.attn_norm, self.ffn_norm = RMSNorm(cfg["model_dim"]), RMSNorm(cfg["model_dim"])

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        y, cache = self.attn(self.attn_norm(x), past)
        x = x + y
        return x + self.ffn(self.ffn_norm(x)), cache


class OpenELM(nn.Module):
    """OpenELM of a corenet-style config ``cfg``, corenet's module names: the output layer is the
    token embedding (``share_input_output_layers``) or ``classifier``."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg, shapes = cfg, reference_shapes(cfg)
        self.token_embeddings = nn.Embedding(cfg["vocab_size"], cfg["model_dim"])
        self.layers = nn.ModuleList(Layer(cfg, q, kv, f) for q, kv, f in zip(shapes["q"], shapes["kv"],
                                                                             shapes["ffn"]))
        self.norm = RMSNorm(cfg["model_dim"])
        tied = cfg.get("share_input_output_layers", False)
        self.classifier = None if tied else nn.Linear(cfg["model_dim"], cfg["vocab_size"], bias=False)

    def forward(self, ids: Tensor, past: list | None = None) -> tuple[Tensor, list]:
        x, caches = self.token_embeddings(ids), []
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, None if past is None else past[i])
            caches.append(cache)
        x = self.norm(x)
        return (F.linear(x, self.token_embeddings.weight) if self.classifier is None else self.classifier(x)), caches

    @torch.no_grad()
    def greedy(self, prompt: list[int], n: int) -> list[int]:
        logits, past = self(torch.tensor([prompt]))
        out = []
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits, past = self(torch.tensor([[out[-1]]]), past)
        return out


#: 4 layers of width 64, 16-wide heads, query-width multipliers 0.5 -> 1.5 in 2 GQA groups, FFN
#: multipliers 0.5 -> 4.0 rounded to multiples of 16: query heads 2, 4, 6, 6 (the third rounded up, the
#: 10% rule of make_divisible), KV heads 1, 2, 3, 3
SMALL = dict(num_transformer_layers=4, model_dim=64, head_dim=16, num_gqa_groups=2, qkv_multipliers=(0.5, 1.5),
             ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=16, vocab_size=97, max_context_length=64,
             share_input_output_layers=True, normalize_qk_projections=True, rope_freq_constant=10000)

#: the parity table's OpenELMs (tests/test_parity.py): SMALL, and unpublished depths as corenet
#: writes them, the fields left out taking corenet's defaults (untied ``classifier``, no q/k norms).
#: At width 112 with 8-wide heads in groups of 2, numpy's rounding sets some layers' heads: 0.925
#: rounds to 0.92 (12 heads; Python's round: 0.93, 14 heads), 0.475 to 0.48 (8 heads; Python's: 0.47, 6)
_ROUNDED = dict(model_dim=112, head_dim=8, num_gqa_groups=2, vocab_size=97, max_context_length=64)
CONFIGS = {
    "corenet-small": SMALL,
    "3-layers-defaults-numpy-rounding": dict(_ROUNDED, num_transformer_layers=3, qkv_multipliers=(0.85, 1.0),
                                             ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=16),
    "5-layers-untied-qk-norm-numpy-rounding": dict(_ROUNDED, num_transformer_layers=5, qkv_multipliers=(0.3, 1.0),
                                                   ffn_multipliers=(1.0, 3.0), ffn_dim_divisor=8,
                                                   normalize_qk_projections=True),
    "7-layers-tied-no-qk-norm-one-multiplier": dict(model_dim=64, head_dim=16, vocab_size=97, max_context_length=64,
                                                    num_transformer_layers=7, qkv_multipliers=0.75,
                                                    ffn_multipliers=2.0, ffn_dim_divisor=32,
                                                    share_input_output_layers=True, normalize_qk_projections=False),
}
