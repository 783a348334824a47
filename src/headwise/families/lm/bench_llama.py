"""The ``llama`` and ``decode`` sections of ``headwise bench`` (registered here, imported by the LM
family's ``bench`` module): headwise's Llama-style block against transformers' ``LlamaForCausalLM``.

``llama``: fp32 training tokens/s (forward, next-token cross-entropy, backward, AdamW) of the
blog's 4-layer model as a Llama-style block (``blog-llama``) with uniform grouped-query attention
(12 query heads sharing 4 key/value heads a layer), against ``LlamaForCausalLM`` holding exactly
the same weights (:meth:`headwise.hf.llama.LLAMA.to_hf`) with SDPA attention (transformers' fastest on
the CPU; eager materialises the score matrix). Per-layer plans keep every layer's KV heads and
move query heads between layers in multiples of them, so each has the uniform model's parameters:
the head-count penalty is the worst plan's tokens/s over the uniform one's. All cases are timed
in the same interleaved rounds (:mod:`headwise.bench.core`).

``decode``: greedy decoding with the KV cache at a long context (1k and 4k tokens already cached):
tokens/s and the cache's bytes, GQA against MHA at the same query heads; and the KV cache's
speed-up over none at ``gen_new_tokens`` new tokens (:func:`headwise.train.generate.generate`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headwise.bench.core import case_ratio, interleave, median, pick_quiet, quiet_mask, ratio_stats, versus_hf
from headwise.bench.report import number, quiet_count, ratio_cell, ratio_shown, target, versus_hf_targets
from headwise.bench.sections import BenchSection, SuiteRun, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.bench.training import hf_loss, make_optimizer, make_train_step
from headwise.model import Transformer
from headwise.model.cache import KVCache
from headwise.params import count_params
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from headwise.train.generate import generate

#: transformers' attention implementation the HF side runs (its fastest on CPU)
HF_ATTENTION = "sdpa"
#: the issue's targets: training vs HF Llama, never slower on a plan, head-count penalty, cache speed-up
LLAMA_VS_HF_GOAL, PENALTY_GOAL, DECODE_SPEEDUP_GOAL = 1.1, 0.9, 5.0


@dataclass(frozen=True)
class LlamaSizes:
    """The two sections' sizes: the full run's, or :meth:`quick`'s small ones."""

    preset: str = "blog-llama"
    d_model: int = 768
    n_layers: int = 4
    heads: int = 12
    kv_heads: int = 4
    mlp_hidden: int = 4096
    vocab_size: int = 32000
    seq_len: int = 256
    batch: int = 4
    rounds: int = 5
    warmup: int = 1
    idle_wait: float = 5.0
    contexts: tuple[int, ...] = (1024, 4096)
    decode_tokens: int = 32

    @classmethod
    def quick(cls) -> LlamaSizes:
        """2 layers of width 256, 8 query heads over 2 KV heads, vocabulary 4096, 2 x 128 tokens a
        step, three rounds; decoding 8 tokens at 256 and 512 cached."""
        return cls(d_model=256, n_layers=2, heads=8, kv_heads=2, mlp_hidden=1024, vocab_size=4096, seq_len=128,
                   batch=2, rounds=3, idle_wait=1.0, contexts=(256, 512), decode_tokens=8)

    @classmethod
    def of(cls, cfg: BenchConfig) -> LlamaSizes:
        """The sizes a bench run uses (``--quick``: the small ones), with its ``--rounds``."""
        return dataclasses.replace(cls.quick() if cfg.quick else cls(), rounds=cfg.rounds)


def ramp(heads: int, kv_heads: int, layers: int) -> list[int]:
    """Query heads per layer rising linearly from ``kv_heads`` (one query head per KV head) to
    ``2 heads - kv_heads``, each a multiple of ``kv_heads``, summing to ``heads * layers``."""
    groups = heads // kv_heads
    if layers == 1 or groups == 1:
        return [heads] * layers
    g = [round(1 + (2 * groups - 2) * i / (layers - 1)) for i in range(layers)]
    g[-1] += groups * layers - sum(g)
    return [x * kv_heads for x in g]


def llama_plans(s: LlamaSizes) -> list[tuple[str, list[int]]]:
    """``(label, query heads per layer)``: uniform, ascending and descending at the same KV heads."""
    up = ramp(s.heads, s.kv_heads, s.n_layers)
    plans = [(f"{s.n_layers}x{s.heads}", [s.heads] * s.n_layers)]
    if up != plans[0][1]:
        plans += [("asc " + ",".join(map(str, up)), up), ("desc " + ",".join(map(str, up[::-1])), up[::-1])]
    return plans


def llama_spec(s: LlamaSizes, heads: list[int], kv_heads: int | None = None, max_seq_len: int | None = None) -> ModelSpec:
    """``s.preset`` at ``s``'s sizes, 64-wide heads, ``heads`` query heads per layer over ``kv_heads``
    (default ``s.kv_heads``) key/value heads a layer."""
    return spec_from_preset(s.preset, d_model=s.d_model, n_layers=s.n_layers, heads=list(heads), head_dim=64,
                            kv_heads=kv_heads or s.kv_heads, mlp_hidden=s.mlp_hidden, vocab_size=s.vocab_size,
                            max_seq_len=max_seq_len or s.seq_len)


def hf_llama(model: Transformer) -> torch.nn.Module:
    """transformers' ``LlamaForCausalLM`` with exactly ``model``'s weights, SDPA attention, in training mode."""
    from headwise.hf.llama import LLAMA  # transformers is an optional extra; only this section needs it

    hf = LLAMA.to_hf(model)
    hf.set_attn_implementation(HF_ATTENTION)
    return hf.train()


def bench_llama(s: LlamaSizes, device: torch.device, log: Callable[[str], None], seed: int = 0) -> dict[str, Any]:
    """Time one training step of every plan and of HF Llama at the uniform plan, interleaved."""
    g = torch.Generator().manual_seed(seed + 3)
    ids = torch.randint(0, s.vocab_size, (s.batch, s.seq_len + 1), generator=g).to(device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    steps: dict[str, Callable[[], None]] = {}
    meta: dict[str, dict[str, Any]] = {}
    hf = opt = None
    for label, heads in llama_plans(s):
        torch.manual_seed(seed)
        model = Transformer(llama_spec(s, heads)).to(device).train()
        optimizer = make_optimizer(model, device)
        steps[f"headwise {label}"] = make_train_step(model, optimizer, inputs, targets, None, device)
        meta[f"headwise {label}"] = dict(impl="headwise", plan=label, heads=heads, params=count_params(model.spec))
        if hf is None:
            hf, opt = hf_llama(model).to(device), optimizer
            hf_opt = make_optimizer(hf, device)
            steps["hf"] = make_train_step(lambda x, m=hf: m(input_ids=x).logits, hf_opt, inputs, targets, None,
                                          device, hf_loss)
            meta["hf"] = dict(impl="hf", plan=label, heads=heads, attn_implementation=HF_ATTENTION)
    prefix = f"[{device.type} fp32 llama B={s.batch} T={s.seq_len}]"
    timings = interleave(steps, s.rounds, s.warmup, device, seed=seed + 13, idle_wait=s.idle_wait,
                         progress=lambda m: log(f"{prefix} {m}"))
    cases = timings.cases(meta, inputs.numel())
    section = {"device": str(device), "precision": "fp32", "preset": s.preset, "batch": s.batch, "seq_len": s.seq_len,
               "d_model": s.d_model, "n_layers": s.n_layers, "kv_heads": s.kv_heads, "vocab_size": s.vocab_size,
               "mlp_hidden": s.mlp_hidden, "rounds": s.rounds, "warmup": s.warmup,
               **versus_hf(hf, HF_ATTENTION, opt, timings, cases)}
    section["comparisons"] = compare_llama(section)
    return section


def compare_llama(section: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every headwise plan / HF Llama at the uniform plan, and every per-layer plan / the uniform one."""
    c = section["cases"]
    ours = [m for m in c.values() if m["impl"] == "headwise"]
    base = f"headwise {ours[0]['plan']}"
    return {"vs_hf": [{"plan": m["plan"], **case_ratio(c, f"headwise {m['plan']}", "hf")} for m in ours],
            "penalty": [{"plan": m["plan"], **case_ratio(c, f"headwise {m['plan']}", base)} for m in ours[1:]]}


@of_part("llama")
def llama_targets(sec: dict[str, Any]) -> list[dict[str, Any]]:
    """>= 1.1x HF Llama at the uniform plan, every plan >= 1.0x of it, worst plan / uniform >= 0.9."""
    what = f"Llama-style block vs HF LlamaForCausalLM ({sec['hf_attn_implementation']}), fp32 training tokens/s"
    out = versus_hf_targets(what, sec["comparisons"]["vs_hf"], LLAMA_VS_HF_GOAL,
                            lambda r: f"uniform {r['plan']}", lambda r: r["plan"])
    pen = sec["comparisons"]["penalty"]
    if pen:
        low = min(pen, key=lambda r: r["ratio"])
        out.append(target("Llama-style head-count penalty (worst plan / uniform, same parameters)",
                          f">= {PENALTY_GOAL}", low["ratio"], low["ratio"] >= PENALTY_GOAL,
                          f"{ratio_shown(low)}: {low['plan']}"))
    return out


@of_part("llama")
def llama_table(e: dict[str, Any]) -> list[str]:
    """tokens/s per plan, its ratio to HF Llama and to the uniform plan."""
    comp, cases = e["comparisons"], e["cases"]
    vs_hf, pen = {r["plan"]: r for r in comp["vs_hf"]}, {r["plan"]: r for r in comp["penalty"]}
    lines = [f"## Llama-style training step ({e['device']}, {e['precision']}, B={e['batch']} x T={e['seq_len']})", "",
             f"{e['preset']} at {e['n_layers']} layers, d_model {e['d_model']}, 64-wide heads over {e['kv_heads']} KV "
             f"heads a layer, SwiGLU {e['mlp_hidden']}, vocab {e['vocab_size']:,}. HF = transformers LlamaForCausalLM "
             f"with the uniform model's weights, {e['hf_attn_implementation']} attention ({e['hf_params']:,} "
             f"parameters); {number(cases['hf']['tokens_per_s_median'], 1)} tok/s ({quiet_count(cases['hf'])} quiet).",
             "", "| plan | params | quiet | headwise tok/s | headwise / HF | vs uniform |", "|---|---|---|---|---|---|"]
    for c in cases.values():
        if c["impl"] == "headwise":
            lines.append(f"| {c['plan']} | {c['params']:,} | {quiet_count(c)} | {number(c['tokens_per_s_median'], 1)} | "
                         f"{ratio_cell(vs_hf[c['plan']])} | {ratio_cell(pen.get(c['plan'])) or 'baseline'} |")
    return lines + [""]


def measure_llama(run: SuiteRun) -> None:
    """The ``llama`` section on the CPU."""
    run.result["llama"] = bench_llama(LlamaSizes.of(run.cfg), torch.device("cpu"), run.log, run.cfg.seed)
    run.snapshot("after llama")


def cache_bytes(cache: KVCache) -> int:
    """Bytes of the cached keys and values (the positions held, not the buffers' spare capacity)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.k, layer.v) if t is not None)


def rewind(cache: KVCache, length: int) -> None:
    """Forget every position after the first ``length`` (the buffers stay)."""
    cache.length = length
    for layer in cache.layers:
        layer.length = min(layer.length, length)


def bench_decode(s: LlamaSizes, new_tokens: int, rounds: int, device: torch.device, log: Callable[[str], None],
                 seed: int = 0) -> dict[str, Any]:
    """Decode ``s.decode_tokens`` tokens after each context of ``s.contexts`` (GQA and MHA), and
    ``new_tokens`` greedy tokens with and without the cache (GQA), interleaved."""
    longest = max(s.contexts) + s.decode_tokens
    models = {}
    for kind, kv in (("gqa", s.kv_heads), ("mha", s.heads)):
        torch.manual_seed(seed)
        models[kind] = Transformer(llama_spec(s, [s.heads] * s.n_layers, kv, max_seq_len=longest)).to(device).eval()
    g = torch.Generator().manual_seed(seed + 5)
    steps: dict[str, Callable[[], None]] = {}
    contexts: list[dict[str, Any]] = []
    for ctx in s.contexts:
        prompt = torch.randint(0, s.vocab_size, (1, ctx), generator=g).to(device)
        for kind, model in models.items():
            cache = model.new_cache()
            with torch.no_grad():
                model(prompt, cache)
            contexts.append({"context": ctx, "attention": kind, "kv_heads": model.spec.kv_heads_per_layer[0],
                             "cache_bytes": cache_bytes(cache), "cache_bytes_per_token": cache_bytes(cache) // ctx})

            def step(m: Transformer = model, c: KVCache = cache, n: int = ctx) -> None:
                rewind(c, n)
                token = torch.zeros(1, 1, dtype=torch.long, device=device)
                with torch.no_grad():
                    for _ in range(s.decode_tokens):
                        token = m(token, c)[:, -1:].argmax(-1)
            steps[f"{kind} @{ctx}"] = step
    model = models["gqa"]
    prompt_ids = torch.randint(0, s.vocab_size, (16,), generator=g).tolist()
    steps["kv-cache"] = lambda: generate(model, prompt_ids, new_tokens, temperature=0.0, use_cache=True)
    steps["no-cache"] = lambda: generate(model, prompt_ids, new_tokens, temperature=0.0, use_cache=False)
    timings = interleave(steps, rounds, 1, device, seed=seed + 17, idle_wait=s.idle_wait,
                         progress=lambda m: log(f"[{device.type} fp32 decode] {m}"))
    for row in contexts:
        row.update(timings.rates(f"{row['attention']} @{row['context']}", s.decode_tokens))
    rates = {k: [new_tokens / t for t in timings.seconds[k]] for k in ("kv-cache", "no-cache")}
    both = quiet_mask(timings.stall["kv-cache"], timings.stall["no-cache"])
    return {"device": str(device), "precision": "fp32", "preset": s.preset, "d_model": s.d_model,
            "n_layers": s.n_layers, "heads": s.heads, "kv_heads": s.kv_heads, "decode_tokens": s.decode_tokens,
            "rounds": rounds, "contexts": contexts, "new_tokens": new_tokens, "cpu_stall": timings.stall,
            "tokens_per_s_median": {k: median([v[i] for i in pick_quiet(timings.quiet(k))[0]]) for k, v in rates.items()},
            "speedup": ratio_stats(rates["kv-cache"], rates["no-cache"], both), "idle_wait_s": timings.waited}


def measure_decode(run: SuiteRun) -> None:
    """The ``decode`` section on the CPU, in fp32."""
    run.result["decode"] = bench_decode(LlamaSizes.of(run.cfg), run.cfg.gen_new_tokens, max(run.cfg.gen_rounds, 2),
                                        torch.device("cpu"), run.log, run.cfg.seed)
    run.snapshot("after decode")


@of_part("decode")
def decode_targets(sec: dict[str, Any]) -> list[dict[str, Any]]:
    """The Llama-style block's KV cache at least 5x faster than none."""
    sp = sec["speedup"]
    return [target(f"Llama-style KV-cache / no-cache decoding at {sec['new_tokens']} new tokens",
                   f">= {DECODE_SPEEDUP_GOAL:g}x", sp["ratio"], sp["ratio"] >= DECODE_SPEEDUP_GOAL,
                   f"{sp['ratio']:.1f}x ({sp.get('basis', '')} rounds)")]


@of_part("decode")
def decode_table(d: dict[str, Any]) -> list[str]:
    """tokens/s and cache bytes per context and attention, then the cache's speed-up."""
    tps = d["tokens_per_s_median"]
    lines = [f"## Llama-style decoding with the KV cache ({d['device']}, {d['precision']}, {d['n_layers']} layers, "
             f"d_model {d['d_model']}, {d['heads']} query heads)", "",
             f"{d['decode_tokens']} greedy tokens after the context already cached; GQA shares {d['kv_heads']} KV heads, "
             "MHA has one per query head.", "",
             "| context | attention | KV heads | cache bytes | bytes / token | quiet | tok/s |", "|---|---|---|---|---|---|---|"]
    for r in d["contexts"]:
        lines.append(f"| {r['context']:,} | {r['attention'].upper()} | {r['kv_heads']} | {r['cache_bytes']:,} | "
                     f"{r['cache_bytes_per_token']:,} | {quiet_count(r)} | {number(r['tokens_per_s_median'], 1)} |")
    return lines + ["", f"{d['new_tokens']} new tokens from a 16-token prompt (GQA): KV cache "
                        f"{number(tps['kv-cache'], 1)} tok/s, no cache {number(tps['no-cache'], 1)} tok/s, "
                        f"{d['speedup']['ratio']:.1f}x.", ""]


register_section(BenchSection(
    "llama", "fp32 training tokens/s of the Llama-style block (blog-llama, 12 query / 4 KV heads) vs transformers' "
             "LlamaForCausalLM (SDPA, same weights) and per-layer query-head plans at the same parameters", 62,
    measure_llama, llama_targets, llama_table))
register_section(BenchSection(
    "decode", "Llama-style KV-cache decoding tokens/s and cache bytes at 1k/4k context (GQA vs MHA), and the "
              "cache's speed-up over none", 63, measure_decode, decode_targets, decode_table))
