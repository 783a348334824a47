"""Condition numbers, attention entropies and effective ranks of timm image models, through timm's
own attention modules: :mod:`headwise.analysis.conditioning`'s quantities for the five families
headwise changes (:mod:`~headwise.families.vision.timm_models`).

For every attention module the matrix ``A`` is the input of its output projection ``proj`` (the
heads' outputs side by side, ``[rows, heads * head_dim]`` per sequence), captured by a forward
pre-hook; the attention probabilities are recomputed, as timm computes them, from the output of
the sub-layer that makes the scores (``qkv``, TNT's ``qk``, VOLO's outlook ``attn``), captured by a
forward hook. What a "sequence" and a "query" are depends on the module's kind:

- ``tokens``: token attention over the whole image (ViT/DeiT's ``Attention`` and its held-width
  subclass, TNT's outer attention over patches, VOLO's transformer blocks). A sequence is an image.
- ``inner``: TNT's inner attention over the pixels of one patch. A sequence is one patch of one image.
- ``window``: DaViT's spatial attention within one window. A sequence is one window of one image,
  padded positions included, since DaViT attends to them too (it masks nothing).
- ``channels``: XCiT's cross-covariance attention and DaViT's channel attention. The probabilities
  are channel x channel per head (``head_dim`` queries over ``head_dim`` keys), not over tokens;
  ``A`` is still tokens x channels. A sequence is an image.
- ``outlook``: VOLO's outlookers. Each head's probabilities are a ``k^2 x k^2`` map per ``k x k``
  window, made by a linear layer rather than queries and keys; ``A`` is the folded sum of the windows'
  outputs, tokens x channels. A sequence is an image; the entropy is a mean over windows and queries.

Not analysed, and listed as such by :func:`timm_attention_layers` with the reason:

- ``class``: XCiT's and VOLO's class-attention layers. One query (the class token): ``A`` is a
  single row, so its condition number and every head's effective rank are 1 by construction.
- a ``tokens`` module that normalises or gates the heads' outputs before ``proj`` (timm's
  ``scale_norm``, ``gated``): the projection's input is then not the heads' outputs.
- ``unknown``: an attention module (by its class name, with a ``proj``) of no kind above.

Imports torch and timm.
"""

from __future__ import annotations

import copy
import math
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models import cait, davit, tnt, volo, xcit
from torch import Tensor, nn

from headwise.analysis.conditioning import (
    LayerStats,
    ModelAnalysis,
    _unwrap,
    attention_entropy,
    condition_number,
    effective_rank,
)
from headwise.errors import HeadwiseError

#: Images per forward pass: one layer's probabilities for this many images are held at once.
CHUNK_IMAGES = 16


# --------------------------------------------------------------------------- probabilities


def _split(out: Tensor, parts: int, heads: int) -> list[Tensor]:
    """A projection's output ``[S, ..., parts * heads * d]`` (positions flattened) as ``parts``
    tensors ``[S, heads, T, d]``, in timm's layout (part, head, channel)."""
    s, width = out.shape[0], out.shape[-1]
    x = out.reshape(s, -1, parts, heads, width // (parts * heads))
    return list(x.permute(2, 0, 3, 1, 4).unbind(0))


def _token_probabilities(attn: nn.Module, out: Tensor) -> Tensor:
    """``softmax(q k^T * scale)`` ``[S, heads, T, T]`` from ``qkv`` (or TNT's ``qk``), after
    timm's q/k norms where the module has them."""
    parts = 2 if hasattr(attn, "qk") else 3
    q, k = _split(out, parts, attn.num_heads)[:2]
    q, k = getattr(attn, "q_norm", nn.Identity())(q), getattr(attn, "k_norm", nn.Identity())(k)
    return ((q @ k.transpose(-2, -1)) * attn.scale).softmax(dim=-1)


def _xca_probabilities(attn: nn.Module, out: Tensor) -> Tensor:
    """XCiT: ``softmax(q^ k^^T * temperature)`` ``[S, heads, d, d]`` over channels, q and k
    l2-normalised over the tokens."""
    q, k, _ = (F.normalize(x.transpose(-2, -1), dim=-1) for x in _split(out, 3, attn.num_heads))
    return ((q @ k.transpose(-2, -1)) * attn.temperature).softmax(dim=-1)


def _davit_channel_probabilities(attn: nn.Module, out: Tensor) -> Tensor:
    """DaViT's channel attention ``[S, heads, d, d]``: ``softmax((k * scale)^T v)`` (timm's
    ``ChannelAttention``; q is what it weighs), or ``softmax((q * scale)^T k)`` for
    ``ChannelAttentionV2``, whose scale is ``N^-1/2`` when dynamic."""
    if isinstance(attn, davit.ChannelAttentionV2):
        q, k, _ = _split(out, 3, attn.groups)
        scale = q.shape[-2] ** -0.5 if attn.dynamic_scale else attn.head_dim ** -0.5
        return ((q * scale).transpose(-2, -1) @ k).softmax(dim=-1)
    _, k, v = _split(out, 3, attn.num_heads)
    return ((k * attn.scale).transpose(-2, -1) @ v).softmax(dim=-1)


def _outlook_probabilities(attn: nn.Module, out: Tensor) -> Tensor:
    """VOLO's outlook attention ``[S, heads, windows, k^2, k^2]`` from its ``attn`` layer's output."""
    kk = attn.kernel_size ** 2
    weights = out.reshape(out.shape[0], -1, attn.num_heads, kk, kk).permute(0, 2, 1, 3, 4)
    return (weights * attn.scale).softmax(dim=-1)


Rule = Callable[[nn.Module, Tensor], Tensor]

#: (timm class, kind, the sub-layer whose output makes the scores, how), first match wins
_KNOWN: tuple[tuple[type, str, str, Rule | None], ...] = (
    (Attention, "tokens", "qkv", _token_probabilities),
    (volo.Attention, "tokens", "qkv", _token_probabilities),
    (tnt.Attention, "tokens", "qk", _token_probabilities),
    (davit.WindowAttention, "window", "qkv", _token_probabilities),
    (xcit.XCA, "channels", "qkv", _xca_probabilities),
    (davit.ChannelAttention, "channels", "qkv", _davit_channel_probabilities),
    (davit.ChannelAttentionV2, "channels", "qkv", _davit_channel_probabilities),
    (volo.OutlookAttention, "outlook", "attn", _outlook_probabilities),
    (cait.ClassAttn, "class", "", None),
    (volo.ClassAttention, "class", "", None),
)

_CLASS_REASON = "one query (the class token): A is one row, its condition number and effective ranks are 1"
_ATTENTION_NAME = re.compile(r"attn|attention|xca", re.IGNORECASE)


# --------------------------------------------------------------------------- traversal


@dataclass(frozen=True, eq=False)
class TimmAttentionLayer:
    """One attention module of a timm model: its ``label`` (the module's name, ``blocks.3.attn``),
    ``kind`` (see the module docstring), ``heads`` and ``head_dim`` (columns of ``A`` per head),
    the sub-layer ``source`` whose output makes its scores, and ``skipped``: why it is not analysed
    (empty when it is)."""

    label: str
    module: nn.Module = field(repr=False)
    kind: str
    heads: int
    head_dim: int
    source: str = ""
    skipped: str = ""
    rule: Rule | None = field(default=None, repr=False)

    def probabilities(self, source_output: Tensor) -> Tensor:
        """The attention probabilities ``[S, heads, ..., queries, keys]`` from the ``source``
        sub-layer's output, as timm computes them (before its attention dropout)."""
        return self.rule(self.module, source_output)


def _describe(label: str, module: nn.Module) -> TimmAttentionLayer | None:
    """The module as an attention layer, or None when it is not one."""
    for cls, kind, source, rule in _KNOWN:
        if isinstance(module, cls):
            break
    else:
        if not (_ATTENTION_NAME.search(type(module).__name__) and isinstance(getattr(module, "proj", None), nn.Linear)):
            return None
        kind, source, rule = "unknown", "", None
    heads = getattr(module, "num_heads", None) or getattr(module, "groups", 1)  # DaViT's channel v2: groups
    head_dim = module.proj.in_features // heads
    if kind == "tokens" and label.rpartition(".")[2] == "attn_in":
        kind = "inner"  # TNT's attention over the pixels of each patch
    skipped = ""
    if kind == "class":
        skipped = _CLASS_REASON
    elif kind == "unknown":
        skipped = f"timm's {type(module).__name__} is no attention kind this analysis knows"
    elif (not isinstance(getattr(module, "norm", nn.Identity()), nn.Identity)
          or getattr(module, "gate", None) is not None):
        skipped = "the heads' outputs are normalised or gated before the projection: its input is not A"
    return TimmAttentionLayer(label, module, kind, heads, head_dim, source if not skipped else "", skipped,
                              rule if not skipped else None)


def timm_attention_layers(model: nn.Module) -> list[TimmAttentionLayer]:
    """Every attention module of a timm ``model``, in module order, the ones not analysed included
    (with ``skipped`` saying why); a module inside an attention module is not another one."""
    layers: list[TimmAttentionLayer] = []
    for label, module in _unwrap(model).named_modules():
        if layers and label.startswith(layers[-1].label + "."):
            continue
        layer = _describe(label, module)
        if layer is not None:
            layers.append(layer)
    return layers


# --------------------------------------------------------------------------- analysis


@dataclass
class _Accumulator:
    """One layer's statistics, reduced as each forward produces them."""

    layer: TimmAttentionLayer
    cond: list[np.ndarray] = field(default_factory=list)
    erank: list[np.ndarray] = field(default_factory=list)
    entropy_sum: np.ndarray | float = 0.0
    sequences: int = 0
    keys: int = 0
    rows: int = 0

    def add_scores(self, _module: nn.Module, _args: Any, out: Tensor) -> None:
        probs = self.layer.probabilities(out)
        per_query = attention_entropy(probs).flatten(2)  # [S, heads, queries]
        self.entropy_sum = self.entropy_sum + per_query.mean(-1).sum(0).double().cpu().numpy()
        self.sequences += probs.shape[0]
        self.keys = probs.shape[-1]

    def add_output(self, _module: nn.Module, args: tuple[Tensor, ...]) -> None:
        a = args[0].reshape(args[0].shape[0], -1, args[0].shape[-1])  # [S, rows, heads * head_dim]
        s, t, _ = a.shape
        self.rows = t
        self.cond.append(condition_number(a).cpu().numpy())
        per_head = a.reshape(s, t, self.layer.heads, self.layer.head_dim).transpose(1, 2)
        self.erank.append(effective_rank(per_head).cpu().numpy())

    def stats(self, index: int) -> LayerStats:
        layer = self.layer
        if not self.cond or not self.sequences:
            raise HeadwiseError(f"attention layer {layer.label} did not run in the model's forward pass")
        return LayerStats(index=index, heads=layer.heads, head_dim=layer.head_dim,
                          attention=f"{layer.kind}:{layer.label}", cond=np.concatenate(self.cond),
                          entropy=self.entropy_sum / self.sequences, erank=np.concatenate(self.erank).mean(0),
                          entropy_uniform=math.log(self.keys))


def analyze_timm_model(model: nn.Module, batches: Iterable[Any], *, chunk: int = CHUNK_IMAGES) -> ModelAnalysis:
    """:func:`~headwise.analysis.conditioning.analyze_model`'s statistics for a timm model over
    ``batches`` of inputs (images ``[B, C, H, W]``; tensors, or batches with ``inputs``): per analysed
    attention layer (:func:`timm_attention_layers`, skipped ones left out; ``LayerStats.index`` is
    the layer's position among the analysed ones, ``attention`` is ``kind:label``) the condition
    number of ``A`` per sequence, and per head the mean attention entropy (nats, over queries and
    sequences; ``entropy_uniform`` is ``log(keys)``) and effective rank of the head's output.

    Runs on a float64 copy of the model (on its device), ``chunk`` images per forward, without
    gradients or autocast, in eval mode; the model is left as it was. ``sequences`` counts
    images; ``seq_len`` is the rows of the first analysed layer's ``A``."""
    model = _unwrap(model)
    params = next(model.parameters(), None)
    device = params.device if params is not None else torch.device("cpu")
    work = model if params is None or params.dtype == torch.float64 else copy.deepcopy(model).to(torch.float64)
    analysed = [layer for layer in timm_attention_layers(work) if not layer.skipped]
    if not analysed:
        raise HeadwiseError(f"{type(model).__name__} has no attention layer this analysis can read")
    accs = [_Accumulator(layer) for layer in analysed]
    images = 0
    with ExitStack() as stack:
        for acc in accs:
            module = acc.layer.module
            stack.callback(getattr(module, acc.layer.source).register_forward_hook(acc.add_scores).remove)
            stack.callback(module.proj.register_forward_pre_hook(acc.add_output).remove)
        stack.callback(work.train, work.training)
        work.eval()
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.autocast(device.type, enabled=False))
        for batch in batches:
            inputs = getattr(batch, "inputs", batch)
            if not isinstance(inputs, Tensor) or inputs.ndim < 2 or inputs.shape[0] == 0:
                shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
                raise HeadwiseError(f"analysis inputs must be a non-empty batch [B, ...], got {shape}")
            for part in inputs.split(chunk):
                work(part.to(device=device, dtype=torch.float64))
            images += inputs.shape[0]
    if not images:
        raise HeadwiseError("no batches to analyse: the evaluation set is empty")
    return ModelAnalysis(layers=[acc.stats(i) for i, acc in enumerate(accs)], sequences=images, seq_len=accs[0].rows)

