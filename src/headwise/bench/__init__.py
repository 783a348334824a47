"""``headwise bench``: the performance suite, interleaved and reported as JSON and markdown.

Its sections are a registry (:mod:`~headwise.bench.sections`): the shared ones are written here
(:mod:`~headwise.bench.training`: training vs Hugging Face GPT-Neo, the head-count penalty, MFU,
bf16; :mod:`~headwise.bench.generation`: generation with and without the KV cache;
:mod:`~headwise.bench.nystrom`: Nyström attention; :mod:`~headwise.bench.gpu`: the rerun on
CUDA), the families' in their folders (tokenization, ViT, masked-LM encoders vs BERT).
:mod:`~headwise.bench.suite` runs the chosen sections with the sizes of
:mod:`~headwise.bench.settings` on the models of :mod:`~headwise.bench.cases`, timed by
:mod:`~headwise.bench.core`; :mod:`~headwise.bench.report` (with
:mod:`~headwise.bench.training_report`) holds the targets and writes the markdown.

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

