"""The benchmark suite: every chosen section of :mod:`headwise.bench.sections` in the suite's order
(the training sections against Hugging Face GPT-Neo, generation, the families' sections such as
tokenization, ViT and masked-LM encoder training, Nyström attention, the GPU rerun), run into one
result document.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from headwise.bench.core import allocator_tuned, load_snapshot, machine_info, now_iso
from headwise.bench.sections import SuiteRun, default_section_names, once, ordered_sections, section_names
from headwise.bench.settings import BenchConfig
from headwise.errors import HeadwiseError


def _start(cfg: BenchConfig, sections: set[str]) -> dict[str, Any]:
    """The result document before any measurement: what runs, where, and the load at the start."""
    return {
        "suite": "headwise bench",
        "date": now_iso(),
        "quick": cfg.quick,
        "config": dataclasses.asdict(cfg),
        "sections": sorted(sections),
        "machine": machine_info(torch.device("cpu")),
        "settings": {"malloc_tuned": allocator_tuned(), "dtype": "float32 (bf16 autocast where marked)",
                     "optimizer": "headwise.train.optim.build_optimizer (the trainer's AdamW, default [optim])",
                     "loss": "cross-entropy on float logits"},
        "load": {"start": load_snapshot()},
        "training": [],
    }


def run_bench(cfg: BenchConfig, sections: set[str] | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the chosen sections (those run by default when None) and return the result document
    (see report)."""
    names = section_names()
    sections = set(default_section_names()) if sections is None else set(sections)
    unknown = sections - set(names)
    if unknown:
        raise HeadwiseError(f"unknown benchmark section(s) {sorted(unknown)}; known: {', '.join(names)}")
    start = time.perf_counter()

    def say(msg: str) -> None:
        if log is not None:
            log(f"[{time.perf_counter() - start:7.1f}s] {msg}")

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    result = _start(cfg, sections)
    la = result["load"]["start"]["loadavg"]
    if la is not None and la[0] > 0.5 * (os.cpu_count() or 1):
        say(f"warning: load average {la[0]:.2f} on {os.cpu_count()} cores: other work will distort the timings")
    run = SuiteRun(cfg, frozenset(sections), result, say)
    for measure in once(s.measure for s in ordered_sections() if s.name in sections):
        measure(run)
    result["load"]["end"] = load_snapshot()
    result["wall_time_s"] = time.perf_counter() - start
    return result
