"""The training sections (``hf``, ``penalty``, ``mfu``, ``bf16``): tokens/s of one training step of
the blog's GPT-Neo for every case, interleaved; one pass times the cases of every chosen section.

All plans of one sequence length are timed in the same interleaved rounds on one batch of token
ids. The headwise models of every plan share one set of weights (every plan of the blog's grid
has the same parameter shapes; only the split into heads differs) and one AdamW; the Hugging Face
models share a copy of those weights made with :meth:`headwise.hf.gpt_neo.GPT_NEO.to_hf`. So both sides start
from the same weights and see the same data, and memory stays at two models' worth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headwise.bench.cases import (
    TrainingCases,
    grid_plans,
    hf_reference,
    meta_twin,
    model_spec,
    plan_label,
    training_cases,
)
from headwise.bench.core import (
    Timings,
    case_ratio,
    cpu_stall_seconds,
    interleave,
    matmul_peak,
    median,
    optimizer_settings,
    pick_quiet,
    quiet_mask,
)
from headwise.bench.sections import BenchSection, SuiteRun, register_section
from headwise.bench.settings import BenchConfig
from headwise.bench.training_report import training_tables, training_targets
from headwise.model import Transformer
from headwise.model.loss import cross_entropy
from headwise.params import count_params, flops_per_token
from headwise.plans import Plan, Scheme
from headwise.train.config import OptimConfig
from headwise.train.optim import build_optimizer
from headwise.train.peak import PROBE_N, remember_cpu_peak

#: A loss of logits [B, T, V] and target ids [B, T].
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: One training step of a case, given its forward, its optimiser, its autocast dtype (or None) and its loss.
StepMaker = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.optim.Optimizer, "torch.dtype | None", Loss],
                     Callable[[], None]]


def headwise_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The LM task's loss (:meth:`headwise.families.lm.lm_task.LMTask.loss`), which ``headwise train`` uses."""
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM loss: ``F.cross_entropy`` of the logits in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The optimiser ``headwise train`` builds with its default ``[optim]`` table, so the benchmark
    times the trainer's own choice of AdamW implementation."""
    return build_optimizer(model, OptimConfig(), device)


def optimizer_step(loss: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """One optimiser step: ``loss()`` (forward and loss), backward, the optimiser's step, gradients released."""

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_train_step(forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                    inputs: torch.Tensor, targets: torch.Tensor, autocast: torch.dtype | None,
                    device: torch.device, loss_fn: Loss = headwise_loss) -> Callable[[], None]:
    """One optimiser step: forward, next-token cross-entropy (``loss_fn``: the LM task's by
    default), backward, AdamW step, gradients released."""

    def loss() -> torch.Tensor:
        ctx = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with ctx:
            return loss_fn(forward(inputs), targets)

    return optimizer_step(loss, optimizer)


@dataclass
class _Cases:
    """The timed cases of one section, in the order they were added (which seeds the rounds'
    shuffles and orders the JSON): a step function and the case's result fields per name."""

    steps: dict[str, Callable[[], None]] = field(default_factory=dict)
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)


def _add_headwise(out: _Cases, cfg: BenchConfig, seq_len: int, cases: TrainingCases, base: Transformer,
                  opt: torch.optim.Optimizer, make_step: StepMaker, precision: str, device: torch.device) -> None:
    """One case per plan, each a meta-built model sharing ``base``'s weights (``base`` itself for
    the first plan), plus its bf16 twin where the plan is one of ``cases.bf16_totals`` on CPU."""
    main_dtype = torch.bfloat16 if precision == "bf16" else None
    for plan in cases.plans:
        spec = model_spec(cfg, plan.heads)
        model = base if plan == cases.plans[0] else meta_twin(lambda: Transformer(spec), base).train()
        name = f"headwise {plan_label(plan)}"
        forward = functools.partial(model, pad_vocab=True)  # as the trainer calls it
        out.steps[name] = make_step(forward, opt, main_dtype, headwise_loss)
        out.meta[name] = dict(impl="headwise", **_plan_fields(plan), precision=precision,
                              flops=flops_per_token(spec, seq_len))
        if (device.type == "cpu" and plan.requested_total in cases.bf16_totals
                and plan.scheme is Scheme.CONSTANT):
            out.steps[f"{name} bf16"] = make_step(forward, opt, torch.bfloat16, headwise_loss)
            out.meta[f"{name} bf16"] = dict(out.meta[name], precision="bf16")


def _add_hf(out: _Cases, cfg: BenchConfig, seq_len: int, cases: TrainingCases, grid: list[Plan],
            base: Transformer, make_step: StepMaker, precision: str, device: torch.device) -> None:
    """One Hugging Face GPT-Neo case per constant plan of ``cases.hf_totals``: the first holds
    ``base``'s weights in GPT-Neo's layout (its own AdamW), the others share them."""
    # transformers is an optional extra; only the hf section needs it
    from transformers import GPTNeoForCausalLM

    from headwise.hf.gpt_neo import GPT_NEO

    main_dtype = torch.bfloat16 if precision == "bf16" else None
    hf_base = None
    hf_opt = None
    for plan in (p for p in grid if p.scheme is Scheme.CONSTANT and p.requested_total in cases.hf_totals):
        spec = model_spec(cfg, plan.heads)
        if hf_base is None:
            # headwise's weights under this plan's head split, copied into GPT-Neo's layout
            hf_base = GPT_NEO.to_hf(meta_twin(lambda: Transformer(spec), base)).to(device)
            model = hf_base
            hf_opt = make_optimizer(hf_base, device)
        else:
            model = meta_twin(lambda: GPTNeoForCausalLM(GPT_NEO.to_config(spec)), hf_base)
        model.train()
        model.config._attn_implementation = "eager"

        def forward(x: torch.Tensor, m: nn.Module = model) -> torch.Tensor:
            return m(x, use_cache=False).logits

        name = f"hf {plan_label(plan)}"
        out.steps[name] = make_step(forward, hf_opt, main_dtype, hf_loss)
        out.meta[name] = dict(impl="hf", **_plan_fields(plan), precision=precision,
                              flops=flops_per_token(spec, seq_len),
                              attn_implementation=model.config._attn_implementation)


def _plan_fields(plan: Plan) -> dict[str, Any]:
    """How a case names its plan in the results (``total`` is the budget asked for)."""
    return dict(plan=plan_label(plan), scheme=plan.scheme.value, total=plan.requested_total,
                heads=list(plan.heads))


@dataclass
class _Rounds:
    """What the interleaved rounds measured: the steps, the matmul peak per precision before
    every round (with its CPU stall), and the peak CUDA memory per case."""

    timings: Timings
    peaks: dict[str, list[float]]
    peak_stall: dict[str, list[float | None]]
    memory: dict[str, int]


def _run_rounds(cases: _Cases, device: torch.device, rounds: int, warmup: int, peak_n: int, seed: int,
                idle_wait: float, progress: Callable[[str], None]) -> _Rounds:
    """Time every case in interleaved rounds, measuring the matmul peak of each precision in use
    before every round (so MFU is normalised by the peak of the same minutes)."""
    precisions = {m["precision"] for m in cases.meta.values()}
    measured = _Rounds(Timings({}, {}), {p: [] for p in precisions}, {p: [] for p in precisions}, {})

    def measure_peaks(r: int) -> None:
        for p in precisions:
            stall0, start = cpu_stall_seconds(), time.perf_counter()
            measured.peaks[p].append(matmul_peak(torch.bfloat16 if p == "bf16" else torch.float32, device, peak_n))
            stall1, elapsed = cpu_stall_seconds(), time.perf_counter() - start
            measured.peak_stall[p].append(None if stall0 is None or stall1 is None else (stall1 - stall0) / elapsed)

    def tracked(name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            torch.cuda.reset_peak_memory_stats(device)
            fn()
            measured.memory[name] = max(measured.memory.get(name, 0), torch.cuda.max_memory_allocated(device))
        return run

    cuda = device.type == "cuda"
    timed = {n: tracked(n, f) if cuda else f for n, f in cases.steps.items()}
    measured.timings = interleave(timed, rounds, warmup, device, before_round=measure_peaks,
                                  progress=progress, seed=seed, idle_wait=idle_wait)
    return measured


def _case_result(timings: Timings, name: str, tokens: int, flops: int, peak: float) -> dict[str, Any]:
    """Rates (:meth:`~headwise.bench.core.Timings.rates`) and MFU of one case."""
    rates = timings.rates(name, tokens)
    rate = rates["tokens_per_s_median"]
    return {
        **rates,
        "flops_per_token": flops,
        "model_flops_per_s_median": flops * rate,
        "mfu": [flops * r / peak for r in rates["tokens_per_s"]],
        "mfu_median": flops * rate / peak,
    }


def _results(cases: _Cases, measured: _Rounds, tokens: int, cuda: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """The matmul peak MFU is measured against per precision, and every case's result."""
    # the median of the quiet peak measurements (all, if none was quiet)
    peak_ref = {}
    for p, values in measured.peaks.items():
        use, _ = pick_quiet(quiet_mask(measured.peak_stall[p]), minimum=1)
        peak_ref[p] = median([values[i] for i in use])
    out_cases = {}
    for name, m in cases.meta.items():
        res = _case_result(measured.timings, name, tokens, m.pop("flops"), peak_ref[m["precision"]])
        if cuda:
            res["peak_memory_bytes"] = measured.memory.get(name)
        out_cases[name] = {**m, **res}
    return peak_ref, out_cases


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

    def make_step(forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                  autocast: torch.dtype | None, loss_fn: Loss) -> Callable[[], None]:
        return make_train_step(forward, optimizer, inputs, targets, autocast, device, loss_fn)  # every case: one batch

    torch.manual_seed(cfg.seed)
    base = Transformer(model_spec(cfg, cases.plans[0].heads)).to(device).train()
    opt = make_optimizer(base, device)
    timed = _Cases()
    _add_headwise(timed, cfg, seq_len, cases, base, opt, make_step, precision, device)
    if cases.hf_totals:
        _add_hf(timed, cfg, seq_len, cases, grid, base, make_step, precision, device)

    prefix = f"[{device.type} {precision} T={seq_len} B={batch}]"
    measured = _run_rounds(timed, device, rounds, warmup, peak_n, cfg.seed + seq_len, cfg.idle_wait,
                           progress=lambda s: log(f"{prefix} {s}"))
    peak_ref, out_cases = _results(timed, measured, tokens, device.type == "cuda")
    # What `headwise train` divides by on this machine, when higher than the figure it has (smaller
    # matmuls than the trainer's own probe do not reach the peak: a tiny test bench offers none).
    if device.type == "cpu" and peak_n >= PROBE_N:
        for p, values in measured.peaks.items():
            remember_cpu_peak(p, max(values), f"{peak_n}x{peak_n} matmul, best of headwise bench's rounds")
    section = {
        "device": str(device), "precision": precision, "seq_len": seq_len, "batch": batch,
        "tokens_per_step": tokens, "rounds": rounds, "warmup": warmup,
        "params": count_params(model_spec(cfg, cases.plans[0].heads)),
        "optimizer": optimizer_settings(opt),
        "peak_flops": dict(measured.peaks),
        "peak_cpu_stall": measured.peak_stall,
        "peak_flops_median": peak_ref,
        "idle_wait_s": measured.timings.waited,
        "cases": out_cases,
    }
    section["comparisons"] = compare(section, cases, grid)
    return section


def compare(section: dict[str, Any], cases: TrainingCases, grid: list[Plan]) -> dict[str, list[dict]]:
    """The ratios of one training section: vs Hugging Face, vs the 4 x 12 plan, bf16 vs fp32."""
    c = section["cases"]
    out: dict[str, list[dict]] = {"vs_hf": [], "penalty": [], "bf16": []}
    base = f"headwise {plan_label(cases.plans[0])}"
    for plan in cases.plans:
        label = plan_label(plan)
        name = f"headwise {label}"
        ref = hf_reference(plan, cases, grid)
        if ref in c:
            out["vs_hf"].append({"plan": label, "heads": list(plan.heads), "reference": ref,
                                 **case_ratio(c, name, ref)})
        if name != base:
            out["penalty"].append({"plan": label, "heads": list(plan.heads), "baseline": base,
                                   **case_ratio(c, name, base)})
        if f"{name} bf16" in c:
            out["bf16"].append({"plan": label, "heads": list(plan.heads), **case_ratio(c, f"{name} bf16", name)})
    return out


def measure_training(run: SuiteRun) -> None:
    """The chosen training sections, in one pass per sequence length: fp32 on the CPU, with the
    bf16 twins at the longest length only (their target is one ratio; it saves time)."""
    cfg, cpu = run.cfg, torch.device("cpu")
    cases = training_cases(cfg, run.sections)
    for t in cfg.seq_lens:
        t_cases = cases if t == max(cfg.seq_lens) else dataclasses.replace(cases, bf16_totals=[])
        run.result["training"].append(bench_training(
            cfg, cpu, t, t_cases, precision="fp32", tokens_per_step=cfg.tokens_per_step,
            rounds=cfg.rounds, warmup=cfg.warmup, peak_n=cfg.peak_n, log=run.log))
        run.snapshot(f"after training T={t}")


for _name, _order, _help in (
    ("hf", 10, "training tokens/s vs transformers' GPTNeoForCausalLM (eager attention)"),
    ("penalty", 20, "tokens/s of every plan of the blog's grid relative to 4 x 12 heads"),
    ("mfu", 30, "model FLOP/s over the measured matmul peak"),
    ("bf16", 40, "bf16 autocast training vs fp32"),
):
    register_section(BenchSection(_name, _help, _order, measure_training, training_targets, training_tables))
