"""Next-token cross-entropy over a large vocabulary without the eager path's full-size temporaries.

``F.cross_entropy(logits.float(), targets)`` on [N, 50,257] logits makes, besides the logits: an
fp32 copy (when they are bf16), the fp32 log-softmax, a zero-filled fp32 gradient for the NLL,
the log-softmax's fp32 gradient, and (bf16) its cast back: five or six passes over N x V memory
that no cache holds. :func:`cross_entropy` reads the logits once (a row block at a time, in fp32,
small enough to stay in the core's cache) and, when a gradient is wanted, writes it in the same
pass, softmax minus one-hot over N, in the logits' own dtype; the backward only scales it (and
not at all for a gradient of 1). Tested against
``F.cross_entropy`` in ``tests/test_fused_loss.py``. Rows whose target is ``ignore_index`` (-100,
as in torch) take no part: :func:`masked_lm_loss` uses that convention for a masked LM's labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

#: the target of a position that takes no part in the loss (torch's ``ignore_index`` default)
IGNORE_INDEX = -100

# Rows of logits handled together per thread on the CPU. Each block is converted to fp32 and
# passed over three or four times, so it should stay in a core's L2 cache (4 rows of 50,304 fp32
# are 0.8 MB; 2-4 rows per block measured fastest, 8 rows 15-20% slower, 64 rows 40%). The loss,
# forward + backward on [1024, 50,304] logits on a 2-core Xeon (AMX), glibc keeping freed memory
# as training does, 7-9 interleaved rounds: bf16 192 ms for F.cross_entropy against 74 (one
# thread, process time) and 102 against 44 (two threads, wall); fp32 140 against 91 (one
# thread). Without the tuned allocator the eager path also page-faults its temporaries in afresh.
CPU_ROWS_PER_THREAD = 4


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits [N, V] against targets [N] over the rows whose target is not
    ``ignore_index``; see :func:`cross_entropy`."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
        n, block = logits.shape[0], CPU_ROWS_PER_THREAD * torch.get_num_threads()
        kept = targets != ignore_index
        count = int(kept.sum())  # the rows the mean is over (none: nan, as F.cross_entropy gives)
        lse = logits.new_empty(n, dtype=torch.float32)
        # With a gradient to come, it is written here, while each block is in the cache:
        # softmax / count, then minus 1 / count at the targets (the backward only scales it).
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        # one fp32 block, reused: fresh memory for every block would cost page faults
        scratch = logits.new_empty(block, logits.shape[1], dtype=torch.float32)
        for start in range(0, n, block):
            end = min(start + block, n)
            x = scratch[:end - start].copy_(logits[start:end])
            torch.logsumexp(x, dim=1, out=lse[start:end])
            if grad is not None:
                grad[start:end].copy_(x.sub_(lse[start:end, None] + math.log(max(count, 1))).exp_())
        # an ignored row reads column 0 here; its term is dropped below
        target_logits = logits.gather(1, targets.where(kept, 0)[:, None]).squeeze(1).float()
        if grad is not None:
            if count < n:
                grad[~kept] = 0
            rows = kept.nonzero().squeeze(1)
            grad[rows, targets[rows]] -= 1 / max(count, 1)
            ctx.save_for_backward(grad)
        return (lse - target_logits).masked_fill(~kept, 0.0).sum() / count

    @staticmethod
    @once_differentiable  # the gradient is a constant computed in the forward: no double backward
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        # The loss is usually backpropagated with 1 (or 1 / accumulation steps); reading the
        # scalar costs nothing on the CPU, a pass over the gradient does.
        return (grad if grad_loss.item() == 1 else grad.mul_(grad_loss)), None, None


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """``F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)`` (mean over the rows
    whose target is not ``ignore_index``; nan when there are none) for logits [N, V] of any float
    dtype and target ids [N]: the log-sum-exp and the softmax are computed in fp32 a few rows at a
    time and the gradient is returned in the logits' dtype (rounded to it before the loss's own
    gradient scales it: a second rounding for bf16 when that factor is not a power of two). Columns of -inf (a padded vocabulary)
    take no probability and get a zero gradient. Other targets must be valid ids; ignored rows
    get a zero gradient.

    Only CPU logits take this path: it was measured there; a GPU keeps PyTorch's fused kernel."""
    if logits.device.type != "cpu":
        return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)
    return _CrossEntropy.apply(logits, targets, ignore_index)


def masked_lm_loss(model: Callable[..., Tensor], inputs: Tensor, labels: Tensor,
                   ignore_index: int = IGNORE_INDEX) -> Tensor:
    """A masked LM's loss (``outputs = "mlm"``), what its training minimises: the mean
    cross-entropy at the positions whose ``labels`` [B, T] are token ids, the rest being
    ``ignore_index``, i.e. ``F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(),
    ignore_index=ignore_index)``; but only those positions are decoded (cramming's
    ``sparse_prediction``: a quarter of the rows of [B T, V] logits at 25% masking), with
    padded-vocabulary logits and :func:`cross_entropy`. ``model`` is a
    :class:`~headwise.model.transformer.Transformer` or a wrapper of one that passes keyword
    arguments on (DDP, ``torch.compile``): it is called as ``model(inputs, pad_vocab=True,
    select=rows)``."""
    rows = labels != ignore_index
    return cross_entropy(model(inputs, pad_vocab=True, select=rows), labels[rows], ignore_index)
