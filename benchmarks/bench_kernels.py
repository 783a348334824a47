"""The measurements behind two of headwise's speed choices, on this machine:

    python3 benchmarks/bench_kernels.py [--rows 1024] [--vocab 50257] [--d-model 768] [--threads N]

1. the output matmul ``h @ W.T`` (rows x d_model x vocab) written into plain rows of ``vocab``
   columns (``F.linear``) or into rows padded to a multiple of ``headwise.model.VOCAB_PAD``, and
   the output head with cross-entropy, forward and backward, both ways (``pad_vocab``);
2. one AdamW step over ~67M parameters, torch's per-tensor loop vs its fused kernel.

Each time is the best of three after one warm-up call, so it shows what the kernel can do, not
the spread a loaded machine adds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from headwise.model import padded_logits, padded_vocab_size


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """Seconds of the fastest of ``repeats`` calls, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def output_head(n: int, v: int, d: int) -> None:
    """Print the output matmul's rate and the head + cross-entropy step's time, plain vs padded."""
    h = torch.randn(n, d, requires_grad=True)
    w = torch.randn(v, d, requires_grad=True)
    y = torch.randint(0, v, (n,))
    gflop = 2 * n * d * v / 1e9
    with torch.no_grad():
        plain = best_of(lambda: F.linear(h, w))
        padded = best_of(lambda: padded_logits(h, w))
    print(f"output matmul, fp32:  plain rows {gflop / plain:6.0f} GFLOP/s   padded rows {gflop / padded:6.0f} GFLOP/s")

    def head_step(pad: bool) -> Callable[[], None]:
        def step() -> None:
            logits = padded_logits(h, w) if pad else F.linear(h, w)
            F.cross_entropy(logits, y).backward()
            h.grad = w.grad = None
        return step

    plain, padded = best_of(head_step(False)), best_of(head_step(True))
    print(f"head + cross-entropy, forward + backward, fp32:  plain {1e3 * plain:6.0f} ms   "
          f"pad_vocab {1e3 * padded:6.0f} ms")


def adamw() -> None:
    """Print one AdamW step's time over ~67M parameters, loop vs fused."""
    layer = torch.nn.Linear(8192, 8192)  # 67.1M parameters, about the blog's model
    for param in layer.parameters():
        param.grad = torch.randn_like(param)
    times = {}
    for fused in (False, True):
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, fused=fused)
        times[fused] = best_of(opt.step)
    print(f"AdamW step, {sum(p.numel() for p in layer.parameters()) / 1e6:.1f}M parameters:  "
          f"loop {1e3 * times[False]:6.0f} ms   fused {1e3 * times[True]:6.0f} ms")


def main(argv: list[str] | None = None) -> int:
    """Print the two comparisons."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024, help="B x T tokens per step")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, v, d = args.rows, args.vocab, args.d_model
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; output head {n} x {d} x {v:,}, "
          f"padded to {padded_vocab_size(v):,} columns")
    output_head(n, v, d)
    adamw()
    return 0


if __name__ == "__main__":
    sys.exit(main())
