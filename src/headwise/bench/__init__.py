"""``headwise bench``: the performance suite (training vs Hugging Face GPT-Neo, head-count
penalty, MFU, bf16, generation, tokenization), interleaved and reported as JSON and markdown.

    from headwise.bench import BenchConfig, run_bench, write_results
    result = run_bench(BenchConfig.quick_config(), log=print)
    write_results(result, "benchmarks/results")
"""

from headwise.bench.core import interleave, matmul_peak, tune_cpu_allocator
from headwise.bench.report import evaluate_targets, render_markdown, write_results
from headwise.bench.suite import SECTIONS, BenchConfig, run_bench

__all__ = [
    "SECTIONS",
    "BenchConfig",
    "evaluate_targets",
    "interleave",
    "matmul_peak",
    "render_markdown",
    "run_bench",
    "tune_cpu_allocator",
    "write_results",
]
