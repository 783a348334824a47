"""The ``encoder`` section of ``headwise bench`` (registered here): masked-LM training tokens/s of headwise's Crammed
BERT against transformers' ``BertForMaskedLM`` at the same shape and parameter count, at the
preset's head plan and a few others.

A step on either side is what its own training does on one batch of ``[CLS] ... [SEP]`` rows of
random ordinary ids, masked once by the encoder family's 80/10/10 rule (the same masked tokens for
both): headwise decodes only the masked positions (:func:`headwise.model.loss.masked_lm_loss`,
what ``MLMTask.train_loss`` runs), Hugging Face computes logits at every position and its loss
with -100 labels elsewhere (``model(input_ids, labels=labels).loss``, its standard path); then
backward, AdamW step, gradients released.

The two architectures differ (cramming's pre-LN, gated-GELU, bias-free blocks and sinusoidal
positions; BERT's post-LN blocks with biases, learned positions and a decoder transform), so the
sides do not share weights. BERT's plain-GELU MLP is given the intermediate size whose matmuls
equal the gated one's (:func:`hf_intermediate`: 2,304 for cramming's 3,072 -> 1,536), so both
models do the same matmul FLOPs per token outside the decoder, and at crammed-bert's shape their
parameter counts differ by 0.7% (BERT's biases, positions and decoder transform). Every headwise plan
ties head_dim to d_model / heads, so all of them share one set of weights and one AdamW; the HF
models (one per uniform head count) share theirs. All cases are timed in the same interleaved
rounds (:mod:`headwise.bench.core`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headwise.bench.cases import meta_twin, plan_label
from headwise.bench.core import case_ratio, interleave, versus_hf
from headwise.bench.report import number, quiet_count, ratio_cell, versus_hf_targets
from headwise.bench.sections import BenchSection, SuiteRun, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.bench.training import make_optimizer, optimizer_step
from headwise.families.encoder.masking import mask_tokens
from headwise.model import Transformer
from headwise.model.features import ACTIVATIONS
from headwise.model.loss import masked_lm_loss
from headwise.params import count_params
from headwise.plans import Plan, Scheme, plan_heads
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from headwise.text.masked_vocab import CLS_ID, NUM_SPECIAL, SEP_ID

#: transformers' attention implementation the HF side runs (its fastest on CPU)
HF_ATTENTION = "sdpa"


def encoder_plans(cfg: BenchConfig) -> list[Plan]:
    """The plans timed: every uniform count of ``encoder_heads`` (the first is the preset's), then a
    linear ramp per ``encoder_ramps`` ratio (last / first layer) at the first count's budget."""
    layers, d = cfg.encoder_layers, cfg.encoder_d_model
    plans = [plan_heads(Scheme.CONSTANT, layers, d, h * layers) for h in cfg.encoder_heads]
    for ratio in cfg.encoder_ramps:
        plan = plan_heads(Scheme.LINEAR, layers, d, cfg.encoder_heads[0] * layers, ratio=ratio)
        if all(p.heads != plan.heads for p in plans):
            plans.append(plan)
    return plans


def encoder_spec(cfg: BenchConfig, heads: tuple[int, ...] | list[int]) -> ModelSpec:
    """``encoder_preset`` (crammed-bert) at ``cfg``'s sizes with ``heads`` per layer, head_dim d_model / heads."""
    return spec_from_preset(
        cfg.encoder_preset, n_layers=cfg.encoder_layers, d_model=cfg.encoder_d_model, heads=list(heads),
        head_dim=None, mlp_hidden=cfg.encoder_mlp_hidden, vocab_size=cfg.encoder_vocab_size,
        max_seq_len=cfg.encoder_seq_len,
    )


def hf_intermediate(spec: ModelSpec) -> int:
    """BERT's intermediate size with the matmul FLOPs and weights of ``spec``'s MLP: a gated MLP
    d -> m -> m/2 -> d has 3m/2 x d weights, a plain one d -> i -> d has 2 i x d."""
    m = spec.layer(0).mlp_hidden
    return 3 * m // 4 if ACTIVATIONS[spec.activation].gated else m


def hf_model(cfg: BenchConfig, spec: ModelSpec, heads: int) -> nn.Module:
    """transformers' ``BertForMaskedLM`` at ``spec``'s shape with ``heads`` heads a layer, no dropout
    (cramming pretrains without), SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM  # an optional extra; only this section needs it

    config = BertConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.n_layers,
        num_attention_heads=heads, intermediate_size=hf_intermediate(spec), max_position_embeddings=spec.max_seq_len,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=spec.layer_norm_eps,
        initializer_range=spec.init_std,
    )
    config._attn_implementation = HF_ATTENTION
    return BertForMaskedLM(config)


def masked_batch(cfg: BenchConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)``: ``encoder_batch`` rows ``[CLS] ids [SEP]`` of random ordinary ids,
    masked at ``encoder_mask_rate`` by the encoder family's rule (:func:`mask_tokens`), seeded."""
    g = torch.Generator().manual_seed(cfg.seed)
    v, t = cfg.encoder_vocab_size, cfg.encoder_seq_len
    rows = torch.randint(NUM_SPECIAL, v, (cfg.encoder_batch, t), generator=g)
    rows[:, 0], rows[:, -1] = CLS_ID, SEP_ID
    return mask_tokens(rows, cfg.encoder_mask_rate, v, g)


def _models(cfg: BenchConfig, plans: list[Plan], device: torch.device) -> tuple[dict, dict, list]:
    """headwise models per plan label and HF models per uniform head count, each side sharing one
    set of weights, and the two optimisers."""
    torch.manual_seed(cfg.seed)
    base = Transformer(encoder_spec(cfg, plans[0].heads)).to(device).train()
    ours: dict[str, nn.Module] = {plan_label(plans[0]): base}
    for plan in plans[1:]:
        ours[plan_label(plan)] = meta_twin(lambda: Transformer(encoder_spec(cfg, plan.heads)), base).train()
    spec = base.spec
    hf_base = hf_model(cfg, spec, cfg.encoder_heads[0]).to(device).train()
    theirs: dict[int, nn.Module] = {cfg.encoder_heads[0]: hf_base}
    for h in cfg.encoder_heads[1:]:
        theirs[h] = meta_twin(lambda: hf_model(cfg, spec, h), hf_base).train()
    return ours, theirs, [make_optimizer(base, device), make_optimizer(hf_base, device)]


def hf_reference(cfg: BenchConfig, plan: Plan) -> int:
    """The HF head count a plan is compared with: the uniform count of ``encoder_heads`` nearest its
    mean heads a layer (the fewer on a tie); every one has the same parameters."""
    mean = plan.total / plan.n_layers
    return min(cfg.encoder_heads, key=lambda h: (abs(h - mean), h))


def bench_encoder(cfg: BenchConfig, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Time one masked-LM training step of every headwise plan and HF model, interleaved."""
    plans = encoder_plans(cfg)
    ours, theirs, (opt, hf_opt) = _models(cfg, plans, device)
    inputs, labels = (t.to(device) for t in masked_batch(cfg))
    steps: dict[str, Callable[[], None]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for plan in plans:
        label, model = plan_label(plan), ours[plan_label(plan)]
        steps[f"headwise {label}"] = optimizer_step(lambda m=model: masked_lm_loss(m, inputs, labels), opt)
        meta[f"headwise {label}"] = dict(impl="headwise", plan=label, heads=list(plan.heads),
                                         reference=f"hf {cfg.encoder_layers}x{hf_reference(cfg, plan)}")
    for h, model in theirs.items():
        steps[f"hf {cfg.encoder_layers}x{h}"] = optimizer_step(
            lambda m=model: m(input_ids=inputs, labels=labels).loss, hf_opt)
        meta[f"hf {cfg.encoder_layers}x{h}"] = dict(impl="hf", plan=f"{cfg.encoder_layers}x{h}",
                                                     heads=[h] * cfg.encoder_layers,
                                                     attn_implementation=model.config._attn_implementation)
    tokens = inputs.numel()
    prefix = f"[{device.type} fp32 encoder B={cfg.encoder_batch} T={cfg.encoder_seq_len}]"
    timings = interleave(steps, cfg.encoder_rounds, cfg.encoder_warmup, device, seed=cfg.seed + 11,
                         idle_wait=cfg.encoder_idle_wait, progress=lambda s: log(f"{prefix} {s}"))
    cases = timings.cases(meta, tokens)
    spec = encoder_spec(cfg, plans[0].heads)
    section = {
        "device": str(device), "precision": "fp32", "preset": cfg.encoder_preset, "batch": cfg.encoder_batch,
        "seq_len": cfg.encoder_seq_len, "tokens_per_step": tokens, "masked_tokens": int((labels != -100).sum()),
        "mask_rate": cfg.encoder_mask_rate, "d_model": spec.d_model, "n_layers": spec.n_layers,
        "mlp_hidden": spec.layer(0).mlp_hidden, "hf_intermediate": hf_intermediate(spec), "vocab_size": spec.vocab_size,
        "rounds": cfg.encoder_rounds, "warmup": cfg.encoder_warmup, "params": count_params(spec),
        **versus_hf(theirs[cfg.encoder_heads[0]], HF_ATTENTION, opt, timings, cases),
    }
    section["comparisons"] = compare_encoder(section)
    return section


def compare_encoder(section: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """headwise / HF per plan (against the case's ``reference``), and every headwise plan / the
    first (the preset's); each a median of per-round ratios (see
    :func:`~headwise.bench.core.ratio_stats`)."""
    c = section["cases"]
    ours = [m for m in c.values() if m["impl"] == "headwise"]
    base = f"headwise {ours[0]['plan']}"
    vs_hf = [{"plan": m["plan"], "heads": m["heads"], "reference": m["reference"],
              **case_ratio(c, f"headwise {m['plan']}", m["reference"])} for m in ours]
    penalty = [{"plan": m["plan"], "heads": m["heads"], "baseline": base,
                **case_ratio(c, f"headwise {m['plan']}", base)} for m in ours[1:]]
    return {"vs_hf": vs_hf, "penalty": penalty}


def measure_encoder(run: SuiteRun) -> None:
    """The ``encoder`` section on the CPU."""
    run.result["encoder"] = bench_encoder(run.cfg, torch.device("cpu"), run.log)
    run.snapshot("after encoder")


#: headwise's masked-LM training over HF BertForMaskedLM at the preset's plan (the issue's target)
ENCODER_VS_HF_GOAL = 1.2


@of_part("encoder")
def encoder_targets(enc: dict[str, Any]) -> list[dict[str, Any]]:
    """Masked-LM training vs HF BERT: >= 1.2x at the preset's plan, never slower at any plan."""
    what = f"Crammed BERT vs HF BertForMaskedLM ({enc['hf_attn_implementation']}), masked-LM training tokens/s"
    return versus_hf_targets(what, enc["comparisons"]["vs_hf"], ENCODER_VS_HF_GOAL,
                             lambda r: f"headwise {r['plan']} / {r['reference']}",
                             lambda r: f"{r['plan']} vs {r['reference']}")


@of_part("encoder")
def encoder_table(e: dict[str, Any]) -> list[str]:
    """tokens/s per headwise plan beside its HF reference, their ratio and the ratio to the preset's plan."""
    comp = e["comparisons"]
    vs_hf, pen = {r["plan"]: r for r in comp["vs_hf"]}, {r["plan"]: r for r in comp["penalty"]}
    cases = e["cases"]
    lines = [f"## Encoder masked-LM training step ({e['device']}, {e['precision']}, B={e['batch']} x T={e['seq_len']})",
             "",
             f"{e['preset']}: {e['n_layers']} layers, d_model {e['d_model']}, gated MLP {e['mlp_hidden']}, vocab "
             f"{e['vocab_size']:,}, head_dim = d_model / heads ({e['params']:,} parameters at every plan); "
             f"{e['masked_tokens']} of {e['tokens_per_step']} tokens masked ({e['mask_rate']:.0%}, 80/10/10). HF = "
             f"transformers BertForMaskedLM, {e['hf_attn_implementation']} attention, intermediate size "
             f"{e['hf_intermediate']} (the gated MLP's matmul FLOPs; {e['hf_params']:,} parameters), its own "
             "weights. A step: forward, masked-LM loss (headwise decodes the masked positions alone; HF all, with -100 "
             "labels elsewhere), backward, AdamW; waited "
             f"{e.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| plan | quiet | headwise tok/s | HF reference | HF tok/s | headwise / HF | vs the preset's plan |",
             "|---|---|---|---|---|---|---|"]
    for c in cases.values():
        if c["impl"] != "headwise":
            continue
        row, ref, penalty = vs_hf[c["plan"]], cases[c["reference"]], ratio_cell(pen.get(c["plan"])) or "baseline"
        lines.append(f"| {c['plan']} | {quiet_count(c)} | {number(c['tokens_per_s_median'], 1)} | {c['reference']} | "
                     f"{number(ref['tokens_per_s_median'], 1)} | {ratio_cell(row)} | {penalty} |")
    lines.append("")
    return lines


register_section(BenchSection(
    "encoder", "masked-LM training tokens/s of Crammed BERT (16 x 12, B=8 x 128) vs transformers' BertForMaskedLM "
               "(SDPA, same shape and parameters) at the preset's and per-layer head plans", 90,
    measure_encoder, encoder_targets, encoder_table))
