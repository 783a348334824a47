"""Where one training step's time goes: torch.profiler over a step of the blog's model.

    python3 benchmarks/profile_step.py [--heads 96,48,24,12] [--seq-len 512] [--batch 2]
        [--precision fp32|bf16] [--hf] [--rows 20] [--threads N]

Builds the model of ``headwise bench`` (GPT-Neo, d 768, 4 layers, vocab 50257), runs one warm-up
step, then profiles one step (forward, cross-entropy, backward, the trainer's AdamW) and prints
the operators by self time, and the share of the step spent in matmuls, attention, the
cross-entropy and the optimiser. ``--hf`` profiles transformers' GPTNeoForCausalLM instead.
"""

from __future__ import annotations

import functools
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from headwise.bench.cases import model_spec
from headwise.bench.settings import BenchConfig
from headwise.bench.core import tune_cpu_allocator
from headwise.bench.training import headwise_loss, hf_loss, make_optimizer, make_train_step
from headwise.errors import OneLineParser, guarded
from headwise.model import Transformer

# Operator name fragments -> the part of the step they belong to
GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention kernel": ("scaled_dot_product", "aten::_softmax", "aten::where"),
    "cross-entropy": ("log_softmax", "nll_loss", "logsumexp", "aten::exp"),
    "optimizer": ("adam", "aten::lerp_", "aten::addcdiv_", "aten::addcmul_", "aten::sqrt", "aten::mul_",
                  "aten::div"),
}


@guarded("profile_step")
def main(argv: list[str] | None = None) -> int:
    """Profile one step and print the table."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="12,12,12,12", help="heads per layer")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--hf", action="store_true", help="profile transformers' GPTNeoForCausalLM (eager)")
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--threads", type=int, help="torch threads (one is steadier on a shared machine)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    cpu = torch.device("cpu")
    cfg = BenchConfig()
    heads = [int(h) for h in args.heads.split(",")]
    torch.manual_seed(0)
    model = Transformer(model_spec(cfg, heads)).train()
    forward = functools.partial(model, pad_vocab=True)  # as the trainer calls it
    if args.hf:
        from headwise.hf.gpt_neo import GPT_NEO

        model = GPT_NEO.to_hf(model).train()
        model.config._attn_implementation = "eager"
        forward = lambda x: model(x, use_cache=False).logits  # noqa: E731
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1))
    step = make_train_step(forward, make_optimizer(model, cpu), ids[:, :-1].contiguous(), ids[:, 1:].contiguous(),
                           torch.bfloat16 if args.precision == "bf16" else None, cpu,
                           hf_loss if args.hf else headwise_loss)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    total = sum(e.self_cpu_time_total for e in events)
    tokens = args.batch * args.seq_len
    print(f"step {wall:.2f} s wall, {tokens / wall:.0f} tokens/s (profiled), {torch.get_num_threads()} torch threads")
    for group, needles in GROUPS.items():
        t = sum(e.self_cpu_time_total for e in events if any(n in e.key.lower() for n in needles))
        print(f"  {group:17s} {100 * t / total:5.1f}% of operator self time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
