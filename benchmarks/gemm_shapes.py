"""How fast this machine runs the matmuls of one training step, shape by shape, against its
square-matmul peak: the ceiling the GEMMs alone put on a step's MFU.

    python3 benchmarks/gemm_shapes.py [--tokens 1024] [--d-model 768] [--vocab 50257] [--layers 4]
                                      [--precision bf16] [--threads N]

For the blog's model (d_model 768, MLP 3,072, tied 50,257-token output padded as in training)
at ``--tokens`` tokens per step it times each forward GEMM and the two backward ones (the
input gradient "dgrad" and the weight gradient "wgrad"), best of five after a warm-up, with
glibc keeping freed memory as training does; then it adds up the time the step's GEMMs need at
those rates and the MFU the step would reach if nothing else took any time. Attention's own
matmuls (inside SDPA) are left out. Uniform heads (the plans change no GEMM shape: the attention
width is d_model).
"""

from __future__ import annotations

import sys

import torch

from headwise.errors import OneLineParser, guarded
from headwise.model import padded_vocab_size
from headwise.train.allocator import tune_cpu_allocator
from headwise.train.peak import matmul_peak

from bench_kernels import best_of  # this folder's timing helper (the script runs from here)


def gflops(m: int, k: int, n: int, layout: str, dtype: torch.dtype, repeats: int = 5) -> float:
    """GFLOP/s of ``[m, k] @ [k, n]``: the fastest of ``repeats`` after one warm-up. ``layout``
    says which operand is a transposed view, as autograd passes them: "nt" (``x @ W.T``, the
    forward), "nn" (``dy @ W``, dgrad), "tn" (``dy.T @ x``, wgrad)."""
    a = torch.randn(k, m, dtype=dtype).t() if layout == "tn" else torch.randn(m, k, dtype=dtype)
    b = torch.randn(n, k, dtype=dtype).t() if layout == "nt" else torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / best_of(lambda: a @ b, repeats) / 1e9


def step_gemms(tokens: int, d: int, hidden: int, vocab: int,
               layers: int) -> list[tuple[str, int, int, int, str, int]]:
    """(name, m, k, n, layout, times per step) of every GEMM of a training step: a linear
    y = x W^T with x [tokens, i], W [o, i] needs x W^T (fwd), dy W (dgrad) and dy^T x (wgrad)."""
    shapes = []
    for name, i, o, count in (("qkv", d, 3 * d, layers), ("out", d, d, layers), ("fc", d, hidden, layers),
                              ("proj", hidden, d, layers), ("lm head", d, vocab, 1)):
        shapes += [(f"{name} fwd", tokens, i, o, "nt", count), (f"{name} dgrad", tokens, o, i, "nn", count),
                   (f"{name} wgrad", o, tokens, i, "tn", count)]
    return shapes


@guarded("gemm_shapes")
def main(argv: list[str] | None = None) -> None:
    """Time the step's GEMMs and print each one's rate."""
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]
    peak = matmul_peak(dtype, torch.device("cpu"), 2048, reps=5)
    print(f"{args.precision}, {torch.get_num_threads()} threads; square-matmul peak {peak / 1e9:,.0f} GFLOP/s")
    total_flops = total_s = 0.0
    for name, m, k, n, layout, count in step_gemms(args.tokens, args.d_model, 4 * args.d_model,
                                                   padded_vocab_size(args.vocab), args.layers):
        rate = gflops(m, k, n, layout, dtype)
        flops = 2 * m * k * n * count
        total_flops += flops
        total_s += flops / (rate * 1e9)
        print(f"  {name:14s} [{m}, {k}] @ [{k}, {n}] x{count}: {rate:7,.0f} GFLOP/s ({rate * 1e9 / peak:4.0%} of peak)")
    print(f"the step's GEMMs: {total_flops / 1e9:,.0f} GFLOP in {1e3 * total_s:,.0f} ms at these rates, "
          f"{total_flops / total_s / 1e9:,.0f} GFLOP/s: {total_flops / total_s / peak:.0%} of the peak, the "
          "most MFU a step reaches if nothing else takes time")


if __name__ == "__main__":
    sys.exit(main())
