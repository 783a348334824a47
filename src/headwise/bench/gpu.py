"""The ``gpu`` section: the training sections again at bf16 autocast on CUDA, with peak memory, and
generation when it was chosen; skipped (or, chosen alone, refused) without CUDA."""

from __future__ import annotations

from typing import Any

import torch

from headwise.bench.cases import training_cases
from headwise.bench.generation import bench_generation
from headwise.bench.report import target
from headwise.bench.sections import BenchSection, SuiteRun, register_section
from headwise.bench.training import bench_training
from headwise.errors import HeadwiseError

#: the training sections rerun on the GPU (the bf16 twins are a CPU comparison: everything here is bf16)
RERUN = frozenset({"hf", "penalty", "mfu"})


def measure_gpu(run: SuiteRun) -> None:
    """The chosen training sections (all of :data:`RERUN` when none was chosen) at bf16 on CUDA,
    and generation when chosen, appended to the result."""
    cfg, result = run.cfg, run.result
    if not torch.cuda.is_available():
        if run.sections == {"gpu"}:
            raise HeadwiseError("section 'gpu' needs a CUDA device and torch.cuda.is_available() is False")
        result["gpu"] = {"skipped": "torch.cuda.is_available() is False"}
        return
    gpu = torch.device("cuda")
    result["machine"]["gpu"] = torch.cuda.get_device_name(gpu)
    gpu_cases = training_cases(cfg, (run.sections & RERUN) or RERUN)
    gpu_cases.bf16_totals = []
    for t in cfg.seq_lens:
        result["training"].append(bench_training(
            cfg, gpu, t, gpu_cases, precision="bf16", tokens_per_step=cfg.gpu_tokens_per_step,
            rounds=cfg.gpu_rounds, warmup=cfg.gpu_warmup, peak_n=cfg.gpu_peak_n, log=run.log))
    if "generate" in run.sections:
        result.setdefault("generation", []).append(bench_generation(cfg, gpu, run.log, torch.bfloat16))


def gpu_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """MFU at the longest T at least 40% of the bf16 matmul peak; the head-count penalty per T."""
    gpu = {s["seq_len"]: s for s in result.get("training", []) if s["device"].startswith("cuda")}
    if not gpu:
        return []
    s = gpu[max(gpu)]
    base = next(iter(c for c in s["cases"].values() if c["impl"] == "headwise"))
    targets = [target(f"GPU MFU bf16, {base['plan']} T={s['seq_len']}", ">= 40% of bf16 matmul peak",
                      base["mfu_median"], base["mfu_median"] >= 0.40, f"{base['mfu_median']:.0%}")]
    for t, s in sorted(gpu.items()):
        rows = s["comparisons"]["penalty"]
        if rows:
            w = min(rows, key=lambda r: r["ratio"])
            targets.append(target(f"GPU head-count penalty, T={t} (worst)", ">= 0.85x", w["ratio"],
                                  w["ratio"] >= 0.85, f"{w['ratio']:.2f}x ({w['plan']})"))
    return targets


# last: it reruns the other sections' models; its tables are the training sections'
register_section(BenchSection("gpu", "the training sections at bf16 with peak memory, when CUDA is available", 100,
                              measure_gpu, gpu_targets))
