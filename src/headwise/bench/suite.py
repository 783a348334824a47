"""The benchmark suite: training throughput against Hugging Face GPT-Neo, the head-count penalty,
MFU, bf16 (:mod:`headwise.bench.training`), generation with and without the KV cache,
tokenization (:mod:`headwise.families.lm.bench`), ViT training against Hugging Face's ViT
(:mod:`headwise.families.vision.bench`), a Nyström attention layer against softmax attention and Hugging
Face's (:mod:`headwise.bench.nystrom`) and masked-LM encoder training against Hugging Face's BERT
(:mod:`headwise.families.encoder.bench`), run section by section into one result document.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from headwise.bench.cases import grid_plans, model_spec, plan_label, training_cases
from headwise.bench.settings import SECTIONS, BenchConfig
from headwise.bench.core import (
    allocator_tuned,
    interleave,
    load_snapshot,
    machine_info,
    median,
    now_iso,
    pick_quiet,
    quiet_mask,
    ratio_stats,
)
from headwise.bench.nystrom import bench_nystrom
from headwise.families.lm.bench import bench_tokenize
from headwise.bench.training import bench_training
from headwise.families.vision.bench import bench_vision
from headwise.families.encoder.bench import bench_encoder
from headwise.errors import HeadwiseError
from headwise.model import Transformer
from headwise.train.generate import generate


def bench_generation(cfg: BenchConfig, device: torch.device, log: Callable[[str], None],
                     autocast: torch.dtype | None = None) -> dict[str, Any]:
    """Greedy generation of ``gen_new_tokens`` tokens by the 4 x 12 model, with and without the
    KV cache (``headwise.train.generate.generate``), interleaved."""
    plan = grid_plans(cfg)[0]
    torch.manual_seed(cfg.seed)
    model = Transformer(model_spec(cfg, plan.heads)).to(device).eval()
    g = torch.Generator().manual_seed(cfg.seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (cfg.gen_prompt_tokens,), generator=g).tolist()
    outputs: dict[str, list[int]] = {}

    def case(use_cache: bool) -> Callable[[], None]:
        def run() -> None:
            ctx = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
            with ctx:
                outputs[str(use_cache)] = generate(model, prompt, cfg.gen_new_tokens, temperature=0.0,
                                                   use_cache=use_cache)
        return run

    cases = {"kv-cache": case(True), "no-cache": case(False)}
    for use_cache in (True, False):  # a short warm-up of both paths
        generate(model, prompt, 4, temperature=0.0, use_cache=use_cache)
    timings = interleave(cases, cfg.gen_rounds, 0, device, idle_wait=cfg.idle_wait,
                         progress=lambda s: log(f"[{device.type} generate {cfg.gen_new_tokens} tokens] {s}"))
    n = cfg.gen_new_tokens
    rates = {k: [n / s for s in v] for k, v in timings.seconds.items()}
    both = quiet_mask(timings.stall["kv-cache"], timings.stall["no-cache"])
    a, b = outputs["True"], outputs["False"]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {
        "device": str(device), "precision": "bf16" if autocast else "fp32", "plan": plan_label(plan),
        "prompt_tokens": cfg.gen_prompt_tokens, "new_tokens": n, "rounds": cfg.gen_rounds,
        "seconds": timings.seconds, "cpu_stall": timings.stall, "tokens_per_s": rates,
        "tokens_per_s_median": {k: median([v[i] for i in pick_quiet(timings.quiet(k))[0]]) for k, v in rates.items()},
        "speedup": ratio_stats(rates["kv-cache"], rates["no-cache"], both),
        "greedy_tokens_agree": same,
    }


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


def _run_gpu(cfg: BenchConfig, sections: set[str], result: dict[str, Any], say: Callable[[str], None]) -> None:
    """The ``gpu`` section: the training sections (all three when none was chosen) at bf16
    autocast on CUDA, and generation when chosen, appended to ``result``."""
    gpu = torch.device("cuda")
    result["machine"]["gpu"] = torch.cuda.get_device_name(gpu)
    gpu_cases = training_cases(cfg, (sections & {"hf", "penalty", "mfu"}) or {"hf", "penalty", "mfu"})
    gpu_cases.bf16_totals = []
    for t in cfg.seq_lens:
        result["training"].append(bench_training(
            cfg, gpu, t, gpu_cases, precision="bf16", tokens_per_step=cfg.gpu_tokens_per_step,
            rounds=cfg.gpu_rounds, warmup=cfg.gpu_warmup, peak_n=cfg.gpu_peak_n, log=say))
    if "generate" in sections:
        result.setdefault("generation", []).append(bench_generation(cfg, gpu, say, torch.bfloat16))


def run_bench(cfg: BenchConfig, sections: set[str] | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the chosen sections (all by default) and return the result document (see report)."""
    sections = set(SECTIONS) if sections is None else set(sections)
    unknown = sections - set(SECTIONS)
    if unknown:
        raise HeadwiseError(f"unknown benchmark section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    start = time.perf_counter()

    def say(msg: str) -> None:
        if log is not None:
            log(f"[{time.perf_counter() - start:7.1f}s] {msg}")

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cpu = torch.device("cpu")
    has_cuda = torch.cuda.is_available()
    if sections == {"gpu"} and not has_cuda:
        raise HeadwiseError("section 'gpu' needs a CUDA device and torch.cuda.is_available() is False")
    result = _start(cfg, sections)
    la = result["load"]["start"]["loadavg"]
    if la is not None and la[0] > 0.5 * (os.cpu_count() or 1):
        say(f"warning: load average {la[0]:.2f} on {os.cpu_count()} cores: other work will distort the timings")
    cases = training_cases(cfg, sections)
    if sections & {"hf", "penalty", "mfu", "bf16"}:
        for t in cfg.seq_lens:
            # bf16 is timed at the longest sequence only (its target is one ratio; it saves time)
            t_cases = cases if t == max(cfg.seq_lens) else dataclasses.replace(cases, bf16_totals=[])
            result["training"].append(bench_training(
                cfg, cpu, t, t_cases, precision="fp32", tokens_per_step=cfg.tokens_per_step,
                rounds=cfg.rounds, warmup=cfg.warmup, peak_n=cfg.peak_n, log=say))
            result["load"][f"after training T={t}"] = load_snapshot()
    if "generate" in sections:
        result["generation"] = [bench_generation(cfg, cpu, say)]
        result["load"]["after generation"] = load_snapshot()
    if "tokenize" in sections:
        result["tokenize"] = bench_tokenize(cfg.tokenize_repeats, say)
    if "vision" in sections:
        result["vision"] = bench_vision(cfg, cpu, say)
        result["load"]["after vision"] = load_snapshot()
    if "nystrom" in sections:
        result["nystrom"] = bench_nystrom(cfg, cpu, say)
        result["load"]["after nystrom"] = load_snapshot()
    if "encoder" in sections:
        result["encoder"] = bench_encoder(cfg, cpu, say)
        result["load"]["after encoder"] = load_snapshot()
    if "gpu" in sections and has_cuda:
        _run_gpu(cfg, sections, result, say)
    elif "gpu" in sections:
        result["gpu"] = {"skipped": "torch.cuda.is_available() is False"}
    result["load"]["end"] = load_snapshot()
    result["wall_time_s"] = time.perf_counter() - start
    return result
