"""The benchmark suite: training throughput against Hugging Face GPT-Neo, the head-count penalty,
MFU, bf16, generation with and without the KV cache, and tokenization.

All plans of one sequence length are timed in the same interleaved rounds on one batch of token
ids. The headwise models of every plan share one set of weights (every plan of the blog's grid
has the same parameter shapes; only the split into heads differs) and one AdamW; the Hugging Face
models share a copy of those weights made with :func:`headwise.hf.to_hf`. So both sides start
from the same weights and see the same data, and memory stays at two models' worth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headwise.bench.core import (
    allocator_tuned,
    cpu_stall_seconds,
    interleave,
    load_snapshot,
    machine_info,
    matmul_peak,
    median,
    now_iso,
    pick_quiet,
    quiet_mask,
    ratio_stats,
)
from headwise.errors import HeadwiseError
from headwise.model import Transformer
from headwise.params import count_params, flops_per_token
from headwise.plans import plan_heads
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec

SECTIONS: tuple[str, ...] = ("hf", "penalty", "mfu", "bf16", "generate", "tokenize", "gpu")
SECTION_HELP = {
    "hf": "training tokens/s vs transformers' GPTNeoForCausalLM (eager attention)",
    "penalty": "tokens/s of every plan of the blog's grid relative to 4 x 12 heads",
    "mfu": "model FLOP/s over the measured matmul peak",
    "bf16": "bf16 autocast training vs fp32",
    "generate": "generation tokens/s with and without the KV cache",
    "tokenize": "GPT-Neo tokenization tokens/s (benchmarks/bench_tokenize.py)",
    "gpu": "the training sections at bf16 with peak memory, when CUDA is available",
}
TOKENIZE_SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_tokenize.py"


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one benchmark run. :meth:`quick_config` is the ~1-2 minute smoke-sized variant."""

    d_model: int = 768
    n_layers: int = 4
    vocab_size: int = 50257
    seq_lens: tuple[int, ...] = (256, 512)
    tokens_per_step: int = 1024  # batch = tokens_per_step // seq_len
    rounds: int = 5
    warmup: int = 1
    schemes: tuple[str, ...] = ("constant", "ascending", "descending")
    totals: tuple[int, ...] = (45, 90, 180)
    bf16_totals: tuple[int, ...] = (45, 180)  # constant plans also timed under bf16 autocast (longest T)
    peak_n: int = 2048
    idle_wait: float = 30.0  # seconds to wait, before each round, for other jobs to go quiet
    threads: int | None = None  # torch.set_num_threads; None keeps torch's default (one per core)
    gen_new_tokens: int = 500
    gen_prompt_tokens: int = 16
    gen_rounds: int = 2
    tokenize_repeats: int = 3
    gpu_tokens_per_step: int = 16384
    gpu_rounds: int = 5
    gpu_warmup: int = 2
    gpu_peak_n: int = 8192
    seed: int = 0
    quick: bool = False

    @classmethod
    def quick_config(cls) -> BenchConfig:
        """Vocabulary 8192, 512 tokens per step, three rounds, 100 generated tokens."""
        return cls(vocab_size=8192, tokens_per_step=512, rounds=3, gen_new_tokens=100, gen_rounds=1,
                   tokenize_repeats=1, gpu_rounds=3, gpu_warmup=1, idle_wait=5.0, quick=True)

    def batch(self, seq_len: int, tokens_per_step: int | None = None) -> int:
        """Sequences per step at ``seq_len`` (at least one)."""
        return max(1, (tokens_per_step or self.tokens_per_step) // seq_len)


@dataclass(frozen=True)
class Plan:
    """One head plan of the grid: its scheme, requested budget and per-layer heads."""

    scheme: str
    total: int
    heads: tuple[int, ...]

    @property
    def label(self) -> str:
        if self.scheme == "constant":
            return f"{len(self.heads)}x{self.heads[0]}"
        return f"{self.scheme[:4]} {','.join(map(str, self.heads))}"


def grid_plans(cfg: BenchConfig) -> list[Plan]:
    """The blog's grid: every scheme at every budget (``plan_heads`` picks the nearest valid plan);
    a plan equal to an earlier one (possible for small d_model) is listed once."""
    plans: list[Plan] = []
    for scheme in cfg.schemes:
        for total in cfg.totals:
            heads = tuple(plan_heads(scheme, cfg.n_layers, cfg.d_model, total).heads)
            if all(p.heads != heads for p in plans):
                plans.append(Plan(scheme, total, heads))
    return plans


def model_spec(cfg: BenchConfig, heads: tuple[int, ...] | list[int]) -> ModelSpec:
    """The blog's GPT-Neo model (alternating global/local layers) at ``cfg``'s size."""
    return spec_from_preset(
        "blog-gpt-neo", d_model=cfg.d_model, n_layers=cfg.n_layers, vocab_size=cfg.vocab_size,
        heads=list(heads), attention=[("global", "local")[i % 2] for i in range(cfg.n_layers)],
    )


def share_parameters(target: nn.Module, source: nn.Module) -> nn.Module:
    """Make ``target`` use ``source``'s parameters and buffers (same names and shapes).

    ``target`` is typically built on the meta device; tied weights stay tied because both names
    get the same source parameter.
    """
    params = dict(source.named_parameters(remove_duplicate=False))
    buffers = dict(source.named_buffers(remove_duplicate=False))
    for name, p in list(target.named_parameters(remove_duplicate=False)):
        if params[name].shape != p.shape:
            raise HeadwiseError(f"cannot share {name}: shape {tuple(params[name].shape)} vs {tuple(p.shape)}")
        owner, _, attr = name.rpartition(".")
        setattr(target.get_submodule(owner), attr, params[name])
    for name, _ in list(target.named_buffers(remove_duplicate=False)):
        owner, _, attr = name.rpartition(".")
        setattr(target.get_submodule(owner), attr, buffers[name])
    return target


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The optimiser ``headwise train`` builds with its default ``[optim]`` table, so the benchmark
    times the trainer's own choice of AdamW implementation."""
    from types import SimpleNamespace

    from headwise.train.config import OptimConfig
    from headwise.train.optim import build_optimizer

    return build_optimizer(model, SimpleNamespace(optim=OptimConfig()), device)


def make_train_step(forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                    inputs: torch.Tensor, targets: torch.Tensor, autocast: torch.dtype | None,
                    device: torch.device) -> Callable[[], None]:
    """One optimiser step: forward, next-token cross-entropy (as the LM task computes it),
    backward, AdamW step, gradients released."""

    def step() -> None:
        ctx = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with ctx:
            logits = forward(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@dataclass
class TrainingCases:
    """Which models one training section times."""

    plans: list[Plan]
    hf_totals: list[int]  # constant plans also timed with Hugging Face GPT-Neo
    bf16_totals: list[int]  # constant plans also timed under bf16 autocast (CPU)


def training_cases(cfg: BenchConfig, sections: set[str]) -> TrainingCases:
    """The union of models the chosen sections need (the baseline 4 x 12 always included)."""
    grid = grid_plans(cfg)
    constant = [p for p in grid if p.scheme == "constant"]
    base = constant[0]
    chosen: list[Plan] = [base]
    hf_totals: list[int] = []
    bf16_totals: list[int] = []
    if "penalty" in sections:
        chosen = grid
    if "hf" in sections:
        hf_totals = [p.total for p in constant]
        extra = constant + [p for p in grid if p.scheme == "descending" and p.total == max(cfg.totals)]
        chosen += [p for p in extra if p not in chosen]
    if "bf16" in sections:
        bf16_totals = [t for t in cfg.bf16_totals if any(p.total == t for p in constant)]
        chosen += [p for p in constant if p.total in bf16_totals and p not in chosen]
    order = {p: i for i, p in enumerate(grid)}
    return TrainingCases(sorted(chosen, key=order.__getitem__), hf_totals, bf16_totals)


def hf_reference(plan: Plan, cases: TrainingCases, grid: list[Plan]) -> str | None:
    """The Hugging Face model a plan is compared with: the constant plan of the same budget
    (so the descending 96,48,24,12 plan meets HF's 4 x 48 model, same parameters)."""
    if plan.total not in cases.hf_totals:
        return None
    constant = next(p for p in grid if p.scheme == "constant" and p.total == plan.total)
    return f"hf {constant.label}"


def _case_result(seconds: list[float], stall: list[float | None], tokens: int, flops: int,
                 peak: float) -> dict[str, Any]:
    """Rates and MFU of one case; medians over its quiet samples when it has two or more."""
    rates = [tokens / s for s in seconds]
    use, basis = pick_quiet(quiet_mask(stall))
    rate = median([rates[i] for i in use])
    return {
        "seconds": seconds,
        "cpu_stall": stall,
        "tokens_per_s": rates,
        "basis": basis,
        "tokens_per_s_median": rate,
        "flops_per_token": flops,
        "model_flops_per_s_median": flops * rate,
        "mfu": [flops * r / peak for r in rates],
        "mfu_median": flops * rate / peak,
    }


def bench_training(cfg: BenchConfig, device: torch.device, seq_len: int, cases: TrainingCases, *,
                   precision: str, tokens_per_step: int, rounds: int, warmup: int, peak_n: int,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Time one training step of every case at ``seq_len``, interleaved; see the module doc."""
    grid = grid_plans(cfg)
    batch = cfg.batch(seq_len, tokens_per_step)
    tokens = batch * seq_len
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=g).to(device)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    main_dtype = torch.bfloat16 if precision == "bf16" else None

    torch.manual_seed(cfg.seed)
    base = Transformer(model_spec(cfg, cases.plans[0].heads)).to(device).train()
    opt = make_optimizer(base, device)
    steps: dict[str, Callable[[], None]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for plan in cases.plans:
        spec = model_spec(cfg, plan.heads)
        if plan == cases.plans[0]:
            model = base
        else:
            with torch.device("meta"):
                model = Transformer(spec)
            share_parameters(model, base).train()
        flops = flops_per_token(spec, seq_len)
        name = f"headwise {plan.label}"
        forward = functools.partial(model, pad_vocab=True)  # as the trainer calls it
        steps[name] = make_train_step(forward, opt, inputs, targets, main_dtype, device)
        meta[name] = dict(impl="headwise", plan=plan.label, scheme=plan.scheme, total=plan.total,
                          heads=list(plan.heads), precision=precision, flops=flops)
        if device.type == "cpu" and plan.total in cases.bf16_totals and plan.scheme == "constant":
            steps[f"{name} bf16"] = make_train_step(forward, opt, inputs, targets, torch.bfloat16, device)
            meta[f"{name} bf16"] = dict(meta[name], precision="bf16")
    if cases.hf_totals:
        from transformers import GPTNeoForCausalLM

        from headwise.hf import to_gpt_neo_config, to_hf

        hf_base = None
        hf_opt = None
        for plan in (p for p in grid if p.scheme == "constant" and p.total in cases.hf_totals):
            spec = model_spec(cfg, plan.heads)
            if hf_base is None:
                # headwise's weights under this plan's head split, copied into GPT-Neo's layout
                with torch.device("meta"):
                    twin = Transformer(spec)
                hf_base = to_hf(share_parameters(twin, base)).to(device)
                model = hf_base
                hf_opt = make_optimizer(hf_base, device)
            else:
                with torch.device("meta"):
                    model = GPTNeoForCausalLM(to_gpt_neo_config(spec))
                share_parameters(model, hf_base)
            model.train()
            model.config._attn_implementation = "eager"
            name = f"hf {plan.label}"

            def forward(x: torch.Tensor, m: nn.Module = model) -> torch.Tensor:
                return m(x, use_cache=False).logits

            steps[name] = make_train_step(forward, hf_opt, inputs, targets, main_dtype, device)
            meta[name] = dict(impl="hf", plan=plan.label, scheme="constant", total=plan.total,
                              heads=list(plan.heads), precision=precision,
                              flops=flops_per_token(spec, seq_len),
                              attn_implementation=model.config._attn_implementation)

    precisions = {m["precision"] for m in meta.values()}
    peaks: dict[str, list[float]] = {p: [] for p in precisions}
    peak_stall: dict[str, list[float | None]] = {p: [] for p in precisions}

    def measure_peaks(r: int) -> None:
        for p in precisions:
            stall0, start = cpu_stall_seconds(), time.perf_counter()
            peaks[p].append(matmul_peak(torch.bfloat16 if p == "bf16" else torch.float32, device, peak_n))
            stall1, elapsed = cpu_stall_seconds(), time.perf_counter() - start
            peak_stall[p].append(None if stall0 is None or stall1 is None else (stall1 - stall0) / elapsed)

    cuda = device.type == "cuda"
    memory: dict[str, int] = {}

    def tracked(name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            torch.cuda.reset_peak_memory_stats(device)
            fn()
            memory[name] = max(memory.get(name, 0), torch.cuda.max_memory_allocated(device))
        return run

    timed = {n: tracked(n, f) if cuda else f for n, f in steps.items()}
    prefix = f"[{device.type} {precision} T={seq_len} B={batch}]"
    timings = interleave(timed, rounds, warmup, device, before_round=measure_peaks,
                         progress=lambda s: log(f"{prefix} {s}"), seed=cfg.seed + seq_len, idle_wait=cfg.idle_wait)
    # The peak MFU is measured against: the median of the quiet measurements (all, if none was)
    peak_ref = {}
    for p, values in peaks.items():
        use, _ = pick_quiet(quiet_mask(peak_stall[p]), minimum=1)
        peak_ref[p] = median([values[i] for i in use])
    out_cases = {}
    for name, m in meta.items():
        res = _case_result(timings.seconds[name], timings.stall[name], tokens, m.pop("flops"),
                           peak_ref[m["precision"]])
        if cuda:
            res["peak_memory_bytes"] = memory.get(name)
        out_cases[name] = {**m, **res}
    section = {
        "device": str(device), "precision": precision, "seq_len": seq_len, "batch": batch,
        "tokens_per_step": tokens, "rounds": rounds, "warmup": warmup,
        "params": count_params(model_spec(cfg, cases.plans[0].heads)),
        "optimizer": {k: opt.defaults.get(k) for k in ("lr", "betas", "weight_decay", "fused", "foreach")},
        "peak_flops": {p: v for p, v in peaks.items()},
        "peak_cpu_stall": peak_stall,
        "peak_flops_median": peak_ref,
        "idle_wait_s": timings.waited,
        "cases": out_cases,
    }
    section["comparisons"] = compare(section, cases, grid)
    return section


def compare(section: dict[str, Any], cases: TrainingCases, grid: list[Plan]) -> dict[str, list[dict]]:
    """The ratios of one training section: vs Hugging Face, vs the 4 x 12 plan, bf16 vs fp32."""
    c = section["cases"]
    out: dict[str, list[dict]] = {"vs_hf": [], "penalty": [], "bf16": []}
    base = f"headwise {cases.plans[0].label}"

    def ratio(a: str, b: str) -> dict[str, Any]:
        both = quiet_mask(c[a]["cpu_stall"], c[b]["cpu_stall"])
        return ratio_stats(c[a]["tokens_per_s"], c[b]["tokens_per_s"], both)

    for plan in cases.plans:
        name = f"headwise {plan.label}"
        ref = hf_reference(plan, cases, grid)
        if ref in c:
            out["vs_hf"].append({"plan": plan.label, "heads": list(plan.heads), "reference": ref, **ratio(name, ref)})
        if name != base:
            out["penalty"].append({"plan": plan.label, "heads": list(plan.heads), "baseline": base,
                                   **ratio(name, base)})
        if f"{name} bf16" in c:
            out["bf16"].append({"plan": plan.label, "heads": list(plan.heads), **ratio(f"{name} bf16", name)})
    return out


def bench_generation(cfg: BenchConfig, device: torch.device, log: Callable[[str], None],
                     autocast: torch.dtype | None = None) -> dict[str, Any]:
    """Greedy generation of ``gen_new_tokens`` tokens by the 4 x 12 model, with and without the
    KV cache (``headwise.train.generate.generate``), interleaved."""
    from headwise.train.generate import generate

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
        "device": str(device), "precision": "bf16" if autocast else "fp32", "plan": plan.label,
        "prompt_tokens": cfg.gen_prompt_tokens, "new_tokens": n, "rounds": cfg.gen_rounds,
        "seconds": timings.seconds, "cpu_stall": timings.stall, "tokens_per_s": rates,
        "tokens_per_s_median": {k: median([v[i] for i in pick_quiet(timings.quiet(k))[0]]) for k, v in rates.items()},
        "speedup": ratio_stats(rates["kv-cache"], rates["no-cache"], both),
        "greedy_tokens_agree": same,
    }


def bench_tokenize(cfg: BenchConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """GPT-Neo tokenization tokens/s from the data helper's ``benchmarks/bench_tokenize.py``."""
    if not TOKENIZE_SCRIPT.is_file():
        return {"skipped": f"{TOKENIZE_SCRIPT} not found (run from a source checkout)"}
    log("[tokenize] benchmarks/bench_tokenize.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tokenize.json"
        proc = subprocess.run([sys.executable, str(TOKENIZE_SCRIPT), "--repeats", str(cfg.tokenize_repeats),
                               "--out", str(out)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            return {"skipped": f"bench_tokenize.py failed: {why}"}
        return json.loads(out.read_text())


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
    result: dict[str, Any] = {
        "suite": "headwise bench",
        "date": now_iso(),
        "quick": cfg.quick,
        "config": dataclasses.asdict(cfg),
        "sections": sorted(sections),
        "machine": machine_info(cpu),
        "settings": {"malloc_tuned": allocator_tuned(), "dtype": "float32 (bf16 autocast where marked)",
                     "optimizer": "headwise.train.optim.build_optimizer (the trainer's AdamW, default [optim])",
                     "loss": "cross-entropy on float logits"},
        "load": {"start": load_snapshot()},
        "training": [],
    }
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
        result["tokenize"] = bench_tokenize(cfg, say)
    if "gpu" in sections and has_cuda:
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
    elif "gpu" in sections:
        result["gpu"] = {"skipped": "torch.cuda.is_available() is False"}
    result["load"]["end"] = load_snapshot()
    result["wall_time_s"] = time.perf_counter() - start
    return result
