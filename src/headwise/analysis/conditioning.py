"""Conditioning and head statistics of a model's attention layers.

For every layer and every evaluated sequence we take Leaner Transformers' matrix
``A = [A_1 ... A_h]`` (N tokens x attention width): the concatenated per-head outputs
``softmax(q k^T * scale) v`` before the output projection, captured by a forward pre-hook on
``blocks[i].attn.out``. Its condition number is ``sigma_max / sigma_min`` over its
``min(N, width)`` singular values, computed in float64.

Rank-deficient rule: a matrix whose smallest singular value is at or below
``sigma_max * max(N, width) * eps`` (``eps`` of the dtype the matrix was *computed* in — the
tolerance of :func:`numpy.linalg.matrix_rank`) is numerically rank deficient and its condition
number is reported as ``inf`` (also for an all-zero matrix). A layer's mean over sequences is
then ``inf`` too; its median stays finite while fewer than half of the sequences are rank
deficient, and ``rankdef_layer{i}`` gives the fraction of rank-deficient sequences.

Per head we also recompute the attention probabilities from the layer's ``qkv`` output under
the model's own scale and the keys its attention kind lets each query see, and report their
entropy (nats, mean over queries) and the effective rank of the head's output ``A_i`` (Roy & Vetterli 2007:
``exp(H(p))`` with ``p = sigma / sum(sigma)``). Statistics are reduced inside the hooks, so no
attention map outlives its micro-batch.
"""

from __future__ import annotations

import copy
import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from headwise.errors import HeadwiseError
from headwise.model import FRONT_ENDS
from headwise.model.kernels import repeat_kv

#: Upper bound on the attention probabilities held at once (bytes), to size micro-batches.
PROBS_BUDGET_BYTES = 256 * 2**20


# --------------------------------------------------------------------------- matrix functions


def rank_tolerance(sigma_max: Tensor, shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """Singular values at or below this are numerical zeros (numpy's ``matrix_rank`` rule)."""
    return sigma_max * max(shape) * torch.finfo(dtype).eps


def condition_number(a: Tensor | np.ndarray) -> Tensor:
    """``sigma_max / sigma_min`` of each matrix in ``a`` (shape ``[..., m, n]``), in float64.

    The singular values are the ``min(m, n)`` ones of each matrix. A numerically rank-deficient
    matrix (smallest singular value at or below :func:`rank_tolerance` for the dtype ``a`` came
    in) gets ``inf``. Returns a float64 tensor of shape ``[...]``.
    """
    a = torch.as_tensor(a)
    if a.ndim < 2 or min(a.shape[-2:]) == 0:
        raise HeadwiseError(f"condition number needs non-empty matrices, got shape {tuple(a.shape)}")
    source = a.dtype if a.dtype.is_floating_point else torch.float64
    s = torch.linalg.svdvals(a.to(torch.float64))
    s_max, s_min = s[..., 0], s[..., -1]
    deficient = s_min <= rank_tolerance(s_max, tuple(a.shape[-2:]), source)
    kappa = s_max / torch.where(deficient, torch.ones_like(s_min), s_min)
    return torch.where(deficient, torch.full_like(kappa, math.inf), kappa)


def effective_rank(a: Tensor | np.ndarray) -> Tensor:
    """Roy & Vetterli's effective rank ``exp(-sum p log p)``, ``p = sigma / sum(sigma)``, of each
    matrix in ``a`` (``[..., m, n]``), in float64; 0 for an all-zero matrix."""
    s = torch.linalg.svdvals(torch.as_tensor(a).to(torch.float64))
    total = s.sum(-1, keepdim=True)
    p = s / torch.where(total > 0, total, torch.ones_like(total))
    erank = torch.exp(torch.special.entr(p).sum(-1))
    return torch.where(total[..., 0] > 0, erank, torch.zeros_like(erank))


def attention_probabilities(attn: nn.Module, qkv: Tensor, key_mask: Tensor | None = None) -> Tensor:
    """The attention probabilities ``[B, heads, T, T]`` of a headwise ``Attention`` layer from its
    ``qkv`` projection output ``[B, T, (heads + 2 kv_heads) head_dim]``: the layer's own q and k of
    a fresh sequence (normed, rotated, each KV head serving its query heads), under the layer's own
    scale and the keys its kind lets each position see
    (:meth:`~headwise.model.attention.AttentionKind.allowed_keys`: a causal mask, a local
    window); keys where ``key_mask`` [B, T] is False (padding) get none. For a Nyström layer these
    are the exact softmax probabilities its approximation stands for."""
    t = qkv.shape[1]
    work = torch.promote_types(qkv.dtype, torch.float32)  # bf16 probabilities are too coarse
    q, k, _ = attn.split_heads(qkv.to(work), 0)
    k = repeat_kv(k, attn.heads)
    scores = (q @ k.transpose(-1, -2)) * attn.scale
    allowed = attn.kind.allowed_keys(attn, t, qkv.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], -math.inf)
    return scores.softmax(dim=-1)


def uniform_entropy(attn: nn.Module, t: int) -> float:
    """Entropy (nats, mean over ``t`` queries) of uniform attention under the layer's mask: the
    largest mean entropy the layer can have, a reference for :func:`attention_entropy`."""
    allowed = attn.kind.allowed_keys(attn, t, torch.device("cpu"))
    keys = allowed.sum(-1) if allowed is not None else torch.full((t,), t)
    return float(torch.log(keys.double()).mean())


def attention_entropy(probs: Tensor) -> Tensor:
    """Entropy (nats) of each query's attention distribution, ``[..., T_q, T_k] -> [..., T_q]``;
    masked keys (probability 0) contribute nothing."""
    return torch.special.entr(probs).sum(-1)


# --------------------------------------------------------------------------- model traversal


def _unwrap(model: nn.Module) -> nn.Module:
    # torch.compile and DDP wrap the model; hooks need the plain modules run eagerly.
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


_ATTN_ATTRS = ("qkv", "out", "heads", "head_dim", "scale", "causal", "kind")


def attention_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """``(block index, attention module)`` for every block with a headwise attention layer;
    a model with none is a HeadwiseError."""
    model = _unwrap(model)
    blocks = getattr(model, "blocks", None) or []
    layers = []
    for i, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if attn is not None and all(hasattr(attn, a) for a in _ATTN_ATTRS):
            layers.append((i, attn))
    if not layers:
        raise HeadwiseError(
            f"{type(model).__name__} has no attention layers to analyse "
            "(expected headwise blocks[i].attn with qkv and out projections)"
        )
    return layers


def _check_inputs(model: nn.Module, inputs: Tensor) -> int:
    """The positions each input of the batch gives the blocks; a HeadwiseError for a batch the
    model cannot read."""
    if not isinstance(inputs, Tensor) or inputs.ndim < 2 or inputs.shape[0] == 0 or inputs.shape[1] == 0:
        shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise HeadwiseError(f"analysis inputs must be a non-empty batch [B, T, ...], got {shape}")
    spec = getattr(model, "spec", None)
    # images give the blocks their patches (and class token), whatever the tensor's layout
    positions = FRONT_ENDS[spec.inputs].input_positions(spec, inputs) if spec is not None else inputs.shape[1]
    limit = getattr(spec, "max_seq_len", None)
    if limit is not None and positions > limit:
        raise HeadwiseError(
            f"a batch of {positions} positions is longer than the model's context "
            f"(max_seq_len {limit}): use shorter sequences"
        )
    return positions


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[int, list[Tensor]]]:
    """Within the block, every forward stores each attention layer's matrix ``A`` (the input of
    ``attn.out``, ``[B, T, width]``) under its block index. Keeps everything: for small probes and
    tests; :func:`analyze_model` reduces on the fly instead."""
    captured: dict[int, list[Tensor]] = {}
    with ExitStack() as stack:
        for i, attn in attention_layers(model):
            captured[i] = []
            handle = attn.out.register_forward_pre_hook(
                lambda _m, args, i=i: captured[i].append(args[0].detach())
            )
            stack.callback(handle.remove)
        yield captured


# --------------------------------------------------------------------------- results


@dataclass
class LayerStats:
    """One attention layer's statistics over the analysed sequences."""

    index: int
    heads: int
    head_dim: int
    attention: str
    #: condition number of A for each sequence (inf: rank deficient)
    cond: np.ndarray
    #: per head: attention entropy in nats, mean over queries and sequences
    entropy: np.ndarray
    #: per head: effective rank of the head's output, mean over sequences
    erank: np.ndarray
    #: entropy of uniform attention under this layer's mask (the maximum mean entropy)
    entropy_uniform: float

    @property
    def width(self) -> int:
        """Attention width (heads x head_dim): the number of columns of A."""
        return self.heads * self.head_dim

    @property
    def cond_mean(self) -> float:
        """Mean condition number over sequences (inf if any sequence is rank deficient)."""
        return float(np.mean(self.cond))

    @property
    def cond_median(self) -> float:
        """Median condition number over sequences."""
        return float(np.median(self.cond))

    @property
    def rank_deficient(self) -> float:
        """Fraction of sequences whose A is numerically rank deficient."""
        return float(np.mean(np.isinf(self.cond)))


@dataclass
class ModelAnalysis:
    """Per-layer statistics of a model on a set of sequences (see the module docstring)."""

    layers: list[LayerStats]
    sequences: int
    seq_len: int

    @property
    def cond_mean(self) -> float:
        """The model's condition number: the average over layers of the per-layer means over
        sequences (Leaner Transformers' Fig. 2 quantity)."""
        return float(np.mean([layer.cond_mean for layer in self.layers]))

    @property
    def cond_median(self) -> float:
        """Average over layers of the per-layer medians over sequences."""
        return float(np.mean([layer.cond_median for layer in self.layers]))

    def metrics(self) -> dict[str, float]:
        """Flat ``name -> value`` dict, what the trainer logs every ``analysis.every`` steps (on one
        evaluation batch, ``spec.analyze(model, [inputs]).metrics()``): ``cond_mean`` (average over
        layers of the per-layer mean condition number over sequences), ``cond_median``, and per
        layer ``cond_layer{i}_mean``, ``cond_layer{i}_median``, ``rankdef_layer{i}``,
        ``entropy_layer{i}`` (nats, mean over heads) and ``erank_layer{i}`` (mean over heads)."""
        out = {"cond_mean": self.cond_mean, "cond_median": self.cond_median}
        for layer in self.layers:
            i = layer.index
            out[f"cond_layer{i}_mean"] = layer.cond_mean
            out[f"cond_layer{i}_median"] = layer.cond_median
            out[f"rankdef_layer{i}"] = layer.rank_deficient
            out[f"entropy_layer{i}"] = float(layer.entropy.mean())
            out[f"erank_layer{i}"] = float(layer.erank.mean())
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per layer plus a final ``layer = "all"`` row (averages over layers)."""
        rows = [
            dict(layer=layer.index, heads=layer.heads, head_dim=layer.head_dim, width=layer.width,
                 attention=layer.attention, cond_mean=layer.cond_mean, cond_median=layer.cond_median,
                 rank_deficient=layer.rank_deficient, entropy=float(layer.entropy.mean()),
                 entropy_uniform=layer.entropy_uniform, erank=float(layer.erank.mean()))
            for layer in self.layers
        ]
        rows.append(dict(
            layer="all", heads=sum(r["heads"] for r in rows), head_dim="", width=sum(r["width"] for r in rows),
            attention="", cond_mean=self.cond_mean, cond_median=self.cond_median,
            rank_deficient=float(np.mean([r["rank_deficient"] for r in rows])),
            entropy=float(np.mean([r["entropy"] for r in rows])),
            entropy_uniform=float(np.mean([r["entropy_uniform"] for r in rows])),
            erank=float(np.mean([r["erank"] for r in rows])),
        ))
        return rows

    def table(self) -> str:
        """A plain-text table of :meth:`rows`."""
        return format_table(self.rows(), TABLE_COLUMNS)


TABLE_COLUMNS = ["layer", "heads", "head_dim", "width", "attention", "cond_mean", "cond_median",
                 "rank_deficient", "entropy", "entropy_uniform", "erank"]


def format_value(value: Any) -> str:
    """Numbers compactly (4 significant digits), everything else as text."""
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Right-aligned fixed-width text table."""
    cells = [[format_value(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


# --------------------------------------------------------------------------- analysis


@dataclass
class _Accumulator:
    heads: int
    head_dim: int
    cond: list[np.ndarray] = field(default_factory=list)
    erank: list[np.ndarray] = field(default_factory=list)
    entropy_sum: np.ndarray | None = None
    sequences: int = 0
    #: the real (unpadded) positions [B, T] of the batch being run; None: every position
    mask: Tensor | None = None
    #: uniform attention's mean entropy, summed over sequences
    uniform_sum: float = 0.0

    def add_output(self, a: Tensor) -> None:
        b, t, _ = a.shape
        if self.mask is not None and not bool(self.mask.all()):
            # padded sequences: each one's real rows alone (lengths differ, so one at a time)
            for i in range(b):
                self._add_matrices(a[i:i + 1, self.mask[i]])
            return
        self._add_matrices(a)

    def _add_matrices(self, a: Tensor) -> None:
        b, t, _ = a.shape
        self.cond.append(condition_number(a).cpu().numpy())
        per_head = a.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        self.erank.append(effective_rank(per_head).cpu().numpy())

    def add_qkv(self, attn: nn.Module, qkv: Tensor) -> None:
        per_query = attention_entropy(attention_probabilities(attn, qkv, self.mask))  # [B, heads, T]
        if self.mask is None:
            ent = per_query.mean(-1).sum(0)  # [heads]
        else:  # mean over each sequence's real queries
            real = self.mask[:, None, :].to(per_query.dtype)
            ent = ((per_query * real).sum(-1) / real.sum(-1).clamp(min=1)).sum(0)
        ent = ent.double().cpu().numpy()
        self.entropy_sum = ent if self.entropy_sum is None else self.entropy_sum + ent
        # the reference: uniform attention over each sequence's own (real) keys
        if self.mask is None or attn.causal:
            self.uniform_sum += uniform_entropy(attn, qkv.shape[1]) * qkv.shape[0]
        else:
            self.uniform_sum += float(self.mask.sum(-1).double().log().sum())
        self.sequences += qkv.shape[0]


def _batch_inputs(batch: Any) -> Tensor:
    return batch.inputs if hasattr(batch, "inputs") else batch


def analyze_model(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    dtype: torch.dtype | None = torch.float64,
) -> ModelAnalysis:
    """Condition numbers, attention entropies and effective ranks of every attention layer of
    ``model`` over ``batches`` (tensors of inputs, or :class:`~headwise.tasks.base.Batch`).

    ``dtype``: run the forward on a copy of the model in this precision (default float64, so
    that condition numbers up to ~1e13 are resolved); ``None`` uses the model as it is (no copy;
    in float32, condition numbers above roughly ``1 / (max(N, width) * 1.2e-7)`` then read as
    rank deficient). Runs without gradients and in eval mode; the model's mode is restored
    afterwards. Batches are split so that the attention maps held at once stay under
    :data:`PROBS_BUDGET_BYTES`.
    """
    model = _unwrap(model)
    layers = attention_layers(model)
    params = next(model.parameters(), None)
    device = params.device if params is not None else torch.device("cpu")
    work = model
    if dtype is not None and params is not None and params.dtype != dtype:
        work = copy.deepcopy(model).to(dtype)
        layers = attention_layers(work)
    accs = {i: _Accumulator(attn.heads, attn.head_dim) for i, attn in layers}
    was_training = work.training
    seq_len = None
    with ExitStack() as stack:
        for i, attn in layers:
            acc = accs[i]
            h1 = attn.qkv.register_forward_hook(lambda m, _args, out, acc=acc, attn=attn: acc.add_qkv(attn, out))
            h2 = attn.out.register_forward_pre_hook(lambda _m, args, acc=acc: acc.add_output(args[0]))
            stack.callback(h1.remove)
            stack.callback(h2.remove)
        stack.callback(work.train, was_training)
        work.eval()
        stack.enter_context(torch.no_grad())
        # The trainer may call this under bf16 autocast; the statistics want full precision.
        stack.enter_context(torch.autocast(device.type, enabled=False))
        max_heads = max(attn.heads for _, attn in layers)
        itemsize = max(4, (dtype or (params.dtype if params is not None else torch.float32)).itemsize)
        for batch in batches:
            inputs = _batch_inputs(batch)
            positions = _check_inputs(model, inputs)
            if seq_len is not None and positions != seq_len:
                raise HeadwiseError(f"analysis batches differ in length ({seq_len} vs {positions})")
            seq_len = positions
            if inputs.is_floating_point() and dtype is not None:
                inputs = inputs.to(dtype)
            per_seq = max_heads * seq_len * seq_len * itemsize * 3  # scores, probabilities, entropy terms
            chunk = max(1, PROBS_BUDGET_BYTES // per_seq)
            for part in inputs.split(chunk):
                part = part.to(device)
                # padding (a sequence task's pad_id) is left out of every statistic
                spec = getattr(work, "spec", None)
                mask = FRONT_ENDS[spec.inputs].key_mask(work, part) if spec is not None else None
                for acc in accs.values():
                    acc.mask = mask
                work(part)
    if seq_len is None:
        raise HeadwiseError("no batches to analyse: the evaluation set is empty")
    stats = []
    for i, attn in layers:
        acc = accs[i]
        stats.append(LayerStats(
            index=i, heads=acc.heads, head_dim=acc.head_dim,
            attention=attn.kind.label(attn),
            cond=np.concatenate(acc.cond), entropy=acc.entropy_sum / acc.sequences,
            erank=np.concatenate(acc.erank).mean(0), entropy_uniform=acc.uniform_sum / acc.sequences,
        ))
    return ModelAnalysis(layers=stats, sequences=accs[layers[0][0]].sequences, seq_len=seq_len)

