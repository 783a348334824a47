"""``headwise bench``: the performance suite (training vs Hugging Face GPT-Neo, head-count
penalty, MFU, bf16, generation, tokenization, ViT, Nyström attention, masked-LM encoders vs
BERT), interleaved and reported as JSON and markdown.

    from headwise.bench import BenchConfig, run_bench, write_results
    result = run_bench(BenchConfig.quick_config(), log=print)
    write_results(result, "benchmarks/results")

The suite itself loads on first use of :func:`run_bench`: the ``headwise`` command imports every
command module at start, and ``headwise bench``'s options need only :mod:`headwise.bench.settings`,
not the models, the trainer and generation the suite imports.
"""

from __future__ import annotations

from typing import Any

from headwise.bench.settings import SECTIONS, BenchConfig
from headwise.bench.core import interleave, matmul_peak, tune_cpu_allocator
from headwise.bench.report import evaluate_targets, render_markdown, write_results

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


def __getattr__(name: str) -> Any:
    # run_bench on first use (PEP 562), see the module doc
    if name == "run_bench":
        from headwise.bench.suite import run_bench

        return run_bench
    raise AttributeError(f"module 'headwise.bench' has no attribute {name!r}")
