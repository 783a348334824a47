"""``headwise bench``: the performance suite (training vs Hugging Face GPT-Neo, head-count
penalty, MFU, bf16, generation, and the sections the families and attention kinds add:
tokenization, ViT, Nyström attention, masked-LM encoders vs BERT), interleaved and reported as
JSON and markdown. The sections are a registry (:mod:`headwise.bench.sections`).

    from headwise.bench import BenchConfig, run_bench, write_results
    result = run_bench(BenchConfig.quick_config(), log=print)
    write_results(result, "benchmarks/results")
"""

from __future__ import annotations

from headwise.bench.core import interleave, matmul_peak, tune_cpu_allocator
from headwise.bench.report import evaluate_targets, render_markdown, write_results
from headwise.bench.sections import SECTIONS, section_names
from headwise.bench.settings import BenchConfig
from headwise.bench.suite import run_bench

__all__ = [
    "SECTIONS",
    "BenchConfig",
    "evaluate_targets",
    "interleave",
    "matmul_peak",
    "render_markdown",
    "run_bench",
    "section_names",
    "tune_cpu_allocator",
    "write_results",
]

