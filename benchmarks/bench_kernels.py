"""The measurements behind four of headwise's speed choices, on this machine:

    python3 benchmarks/bench_kernels.py [--rows 1024] [--vocab 50257] [--d-model 768] [--threads N]

1. the output matmul ``h @ W.T`` (rows x d_model x vocab) written into plain rows of ``vocab``
   columns (``F.linear``) or into rows padded to a multiple of ``headwise.model.VOCAB_PAD``, and
   the output head with cross-entropy, forward and backward, both ways (``pad_vocab``);
2. one AdamW step over ~67M parameters, torch's per-tensor loop vs its fused kernel;
3. the LM loss on the padded logits, forward + backward, ``F.cross_entropy`` (in fp32, as
   before) vs ``headwise.model.loss.cross_entropy``, on fp32 and on bf16 logits;
4. one causal attention layer's SDPA call, forward + backward (B = 2, T = 512, attention width
   768), in bf16 and in fp32 per head width: why heads up to
   ``headwise.model.kernels.CPU_BF16_FP32_MAX_HEAD_DIM`` wide are attended in fp32 under bf16.

Each time is the best of three after one warm-up call, so it shows what the kernel can do, not
the spread a loaded machine adds; glibc keeps freed memory, as in training.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from headwise.errors import OneLineParser, guarded
from headwise.model import padded_logits, padded_vocab_size
from headwise.model.loss import cross_entropy
from headwise.train.allocator import tune_cpu_allocator


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
    # GPT-Neo's initialisation scale: unit-scale weights would make logits of size ~30 whose
    # softmax gradient is mostly subnormal floats, which the CPU multiplies ~100x slower
    w = (0.02 * torch.randn(v, d)).requires_grad_(True)
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


def lm_loss(n: int, v: int) -> None:
    """Print the LM loss's forward + backward time on padded logits, eager vs headwise's."""
    v_pad = padded_vocab_size(v)
    y = torch.randint(0, v, (n,))
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(n, v_pad).to(dtype)
        logits[:, v:] = float("-inf")
        logits.requires_grad_(True)

        def step(loss: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                loss(logits).backward()
                logits.grad = None
            return run

        eager = best_of(step(lambda x: F.cross_entropy(x.float(), y)))
        ours = best_of(step(lambda x: cross_entropy(x, y)))
        name = str(dtype).removeprefix("torch.")
        print(f"LM loss, forward + backward, {name} logits:  F.cross_entropy {1e3 * eager:6.0f} ms   "
              f"headwise.model.loss {1e3 * ours:6.0f} ms")


def attention_by_width(width: int = 768, t: int = 512, batch: int = 2) -> None:
    """Print one causal SDPA call's forward + backward time in bf16 and fp32 per head width."""
    for head_dim in (8, 16, 32, 64, 128):
        heads = width // head_dim
        times = {}
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v = (torch.randn(batch, heads, t, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))

            def step() -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                q.grad = k.grad = v.grad = None
            times[dtype] = best_of(step)
        print(f"attention, {heads} heads of {head_dim}, forward + backward:  bf16 {1e3 * times[torch.bfloat16]:6.1f} ms"
              f"   fp32 {1e3 * times[torch.float32]:6.1f} ms")


@guarded("bench_kernels")
def main(argv: list[str] | None = None) -> int:
    """Print the four comparisons."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024, help="B x T tokens per step")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tune_cpu_allocator()
    n, v, d = args.rows, args.vocab, args.d_model
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; output head {n} x {d} x {v:,}, "
          f"padded to {padded_vocab_size(v):,} columns")
    output_head(n, v, d)
    adamw()
    lm_loss(n, v)
    attention_by_width()
    return 0


if __name__ == "__main__":
    sys.exit(main())
