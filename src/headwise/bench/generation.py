"""The ``generate`` section: greedy generation tokens/s of the blog's 4 x 12 model with and without
the KV cache (:func:`headwise.train.generate.generate`), interleaved."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from headwise.bench.cases import grid_plans, model_spec, plan_label
from headwise.bench.core import interleave, median, pick_quiet, quiet_mask, ratio_stats
from headwise.bench.report import number, target
from headwise.bench.sections import BenchSection, SuiteRun, register_section
from headwise.bench.settings import BenchConfig
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



def measure_generation(run: SuiteRun) -> None:
    """The ``generate`` section on the CPU, in fp32."""
    run.result["generation"] = [bench_generation(run.cfg, torch.device("cpu"), run.log)]
    run.snapshot("after generation")


def generation_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The KV cache at least 5x faster than none, on the CPU."""
    targets = []
    for gen in result.get("generation", []):
        if gen["device"] != "cpu":
            continue
        sp = gen["speedup"]
        targets.append(target(f"KV-cache / no-cache generation at {gen['new_tokens']} new tokens", ">= 5x",
                              sp["ratio"], sp["ratio"] >= 5.0, f"{sp['ratio']:.1f}x ({sp.get('basis', '')} rounds)"))
    return targets


def generation_tables(result: dict[str, Any]) -> list[str]:
    """One table per measured device and precision."""
    lines = []
    for gen in result.get("generation", []):
        tps = gen["tokens_per_s_median"]
        lines += [f"## Generation ({gen['device']}, {gen['precision']}, {gen['plan']}, greedy, "
                  f"{gen['prompt_tokens']}-token prompt)", "",
                  "| new tokens | KV cache tok/s | no cache tok/s | speedup | greedy tokens agree |",
                  "|---|---|---|---|---|",
                  f"| {gen['new_tokens']} | {number(tps['kv-cache'], 1)} | {number(tps['no-cache'], 1)} | "
                  f"{gen['speedup']['ratio']:.1f}x | {gen['greedy_tokens_agree']} / {gen['new_tokens']} |", ""]
    return lines


register_section(BenchSection("generate", "generation tokens/s with and without the KV cache", 50,
                              measure_generation, generation_targets, generation_tables))
