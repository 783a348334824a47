"""The ``vision`` section of ``headwise bench``: training images/s of headwise's ViT against transformers'
``ViTForImageClassification`` with the same weights, at two head counts of tied head width.

The headwise models of every head count share one set of weights and one AdamW (the head count
changes no parameter shape when head_dim = d_model / heads); the Hugging Face models share a copy
of them made with :meth:`headwise.hf.vit.VIT.to_hf`, their own AdamW, and SDPA attention (the
fastest transformers offers on CPU). All cases are timed in the same interleaved rounds on one
batch of random images and labels, as the training sections are (:mod:`headwise.bench.core`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headwise.bench.cases import meta_twin
from headwise.bench.core import case_ratio, interleave, versus_hf
from headwise.bench.report import number, quiet_count, ratio_cell, ratio_shown, target
from headwise.bench.sections import BenchSection, SuiteRun, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.bench.training import make_optimizer, optimizer_step
from headwise.model import Transformer
from headwise.params import count_params
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec

#: transformers' attention implementation the HF side runs (its fastest on CPU)
HF_ATTENTION = "sdpa"


def vision_spec(cfg: BenchConfig, heads: int) -> ModelSpec:
    """The benchmark's ViT (the ``vit-small-32`` preset at ``cfg``'s sizes) with ``heads`` heads
    per layer of width d_model / heads."""
    return spec_from_preset(
        "vit-small-32", image_size=cfg.vision_image_size, patch_size=cfg.vision_patch_size,
        channels=cfg.vision_channels, num_classes=cfg.vision_classes, d_model=cfg.vision_d_model,
        n_layers=cfg.vision_layers, heads=[heads] * cfg.vision_layers, mlp_hidden=cfg.vision_mlp_hidden,
        head_dim=None,
    )


def vision_label(cfg: BenchConfig, heads: int) -> str:
    """A case's plan in results: layers x heads (``6x12``)."""
    return f"{cfg.vision_layers}x{heads}"


def make_image_step(forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                    images: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    """One optimiser step: class logits, cross-entropy, backward, AdamW step, gradients released."""
    return optimizer_step(lambda: F.cross_entropy(forward(images), labels), optimizer)


def _models(cfg: BenchConfig, device: torch.device) -> tuple[dict[int, nn.Module], dict[int, nn.Module], list]:
    """headwise and Hugging Face models per head count, each side sharing one set of weights,
    and the two optimisers."""
    from transformers import ViTForImageClassification  # an optional extra; only this section needs it

    from headwise.hf.vit import VIT

    counts = cfg.vision_heads
    torch.manual_seed(cfg.seed)
    base = Transformer(vision_spec(cfg, counts[0])).to(device).train()
    ours: dict[int, nn.Module] = {counts[0]: base}
    hf_base = VIT.to_hf(base, attn_implementation=HF_ATTENTION).to(device).train()
    theirs: dict[int, nn.Module] = {counts[0]: hf_base}
    for h in counts[1:]:
        spec = vision_spec(cfg, h)
        ours[h] = meta_twin(lambda: Transformer(spec), base).train()
        theirs[h] = meta_twin(lambda: ViTForImageClassification(VIT.to_config(spec)), hf_base).train()
        theirs[h].set_attn_implementation(HF_ATTENTION)
    return ours, theirs, [make_optimizer(base, device), make_optimizer(hf_base, device)]


def bench_vision(cfg: BenchConfig, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Time one training step of headwise's and HF's ViT at every head count, interleaved."""
    ours, theirs, (opt, hf_opt) = _models(cfg, device)
    batch = cfg.vision_batch
    g = torch.Generator().manual_seed(cfg.seed)
    images = torch.randn(batch, cfg.vision_channels, cfg.vision_image_size, cfg.vision_image_size, generator=g)
    labels = torch.randint(0, cfg.vision_classes, (batch,), generator=g)
    images, labels = images.to(device), labels.to(device)

    steps: dict[str, Callable[[], None]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for h in cfg.vision_heads:
        label = vision_label(cfg, h)
        hf_model = theirs[h]
        steps[f"headwise {label}"] = make_image_step(ours[h], opt, images, labels)
        steps[f"hf {label}"] = make_image_step(lambda x, m=hf_model: m(pixel_values=x).logits, hf_opt, images, labels)
        meta[f"headwise {label}"] = dict(impl="headwise", plan=label, heads=h)
        meta[f"hf {label}"] = dict(impl="hf", plan=label, heads=h,
                                   attn_implementation=hf_model.config._attn_implementation)
    prefix = f"[{device.type} fp32 vision B={batch}]"
    timings = interleave(steps, cfg.vision_rounds, cfg.vision_warmup, device, seed=cfg.seed + 7,
                         idle_wait=cfg.vision_idle_wait, progress=lambda s: log(f"{prefix} {s}"))
    cases = timings.cases(meta, batch, "images")
    spec = vision_spec(cfg, cfg.vision_heads[0])
    section = {
        "device": str(device), "precision": "fp32", "batch": batch, "image_size": cfg.vision_image_size,
        "patch_size": cfg.vision_patch_size, "channels": cfg.vision_channels, "d_model": cfg.vision_d_model,
        "n_layers": cfg.vision_layers, "mlp_hidden": cfg.vision_mlp_hidden, "num_classes": cfg.vision_classes,
        "positions": spec.max_seq_len, "heads": list(cfg.vision_heads), "rounds": cfg.vision_rounds,
        "warmup": cfg.vision_warmup, "params": count_params(spec),
        **versus_hf(theirs[cfg.vision_heads[0]], HF_ATTENTION, opt, timings, cases),
    }
    section["comparisons"] = compare_vision(section)
    return section


def compare_vision(section: dict[str, Any]) -> dict[str, Any]:
    """headwise / HF per head count, and the head-count penalty: headwise at the largest head
    count / at the smallest (each a median of per-round ratios, see
    :func:`~headwise.bench.core.ratio_stats`)."""
    c = section["cases"]

    def ratio(a: str, b: str) -> dict[str, Any]:
        return case_ratio(c, a, b, unit="images")

    heads = section["heads"]
    labels = {h: next(m["plan"] for m in c.values() if m["heads"] == h) for h in heads}
    vs_hf = [{"plan": labels[h], "heads": h, "reference": f"hf {labels[h]}",
              **ratio(f"headwise {labels[h]}", f"hf {labels[h]}")} for h in heads]
    low, high = min(heads), max(heads)
    penalty = {"plan": labels[high], "heads": high, "baseline": f"headwise {labels[low]}",
               **ratio(f"headwise {labels[high]}", f"headwise {labels[low]}")}
    hf_penalty = {"plan": labels[high], "heads": high, "baseline": f"hf {labels[low]}",
                  **ratio(f"hf {labels[high]}", f"hf {labels[low]}")}
    return {"vs_hf": vs_hf, "penalty": penalty, "hf_penalty": hf_penalty}


def measure_vision(run: SuiteRun) -> None:
    """The ``vision`` section on the CPU."""
    run.result["vision"] = bench_vision(run.cfg, torch.device("cpu"), run.log)
    run.snapshot("after vision")


@of_part("vision")
def vision_targets(vision: dict[str, Any]) -> list[dict[str, Any]]:
    """headwise at least as fast as HF at every head count; the head-count penalty at least 0.9x."""
    comp = vision["comparisons"]
    targets = [target(f"ViT vs HF ViTForImageClassification ({vision.get('hf_attn_implementation')}), "
                      f"training images/s: headwise {row['plan']} / {row['reference']}", ">= 1.0x",
                      row["ratio"], row["ratio"] >= 1.0, ratio_shown(row)) for row in comp["vs_hf"]]
    pen = comp["penalty"]
    targets.append(target(f"ViT head-count penalty: headwise {pen['plan']} / {pen['baseline'].split()[-1]}",
                          ">= 0.9x", pen["ratio"], pen["ratio"] >= 0.9, ratio_shown(pen)))
    return targets


@of_part("vision")
def vision_table(v: dict[str, Any]) -> list[str]:
    """images/s of both sides per head count, their ratio and the head-count penalty."""
    comp = v["comparisons"]
    vs_hf = {r["plan"]: r for r in comp["vs_hf"]}
    lines = [f"## Vision training step ({v['device']}, {v['precision']}, B={v['batch']} images)", "",
             f"ViT: {v['image_size']} px, {v['channels']} channels, patch {v['patch_size']} ({v['positions']} "
             f"positions with the class token), d_model {v['d_model']}, {v['n_layers']} layers, MLP "
             f"{v['mlp_hidden']}, {v['num_classes']} classes, head_dim = d_model / heads ({v['params']:,} parameters "
             f"at every head count). HF = transformers ViTForImageClassification, {v['hf_attn_implementation']} "
             "attention, same weights (headwise.hf.vit.VIT.to_hf). A step is forward, cross-entropy, backward and "
             f"AdamW; waited {v.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| heads | quiet | headwise images/s | HF images/s | headwise / HF | vs fewest heads (headwise) |",
             "|---|---|---|---|---|---|"]
    pen = comp["penalty"]
    for h in v["heads"]:
        label = next(c["plan"] for c in v["cases"].values() if c["heads"] == h)
        ours, theirs = v["cases"][f"headwise {label}"], v["cases"][f"hf {label}"]
        penalty = ratio_cell(pen) if pen["plan"] == label else ("baseline" if pen["baseline"].endswith(label) else "")
        lines.append(f"| {label} | {quiet_count(ours)} | {number(ours['images_per_s_median'], 1)} | "
                     f"{number(theirs['images_per_s_median'], 1)} | {ratio_cell(vs_hf.get(label))} | {penalty} |")
    hf_pen = comp.get("hf_penalty")
    if hf_pen:
        lines += ["", f"HF's own head-count ratio, {hf_pen['plan']} / {hf_pen['baseline'].split()[-1]}: "
                      f"{ratio_cell(hf_pen)}."]
    lines.append("")
    return lines


register_section(BenchSection(
    "vision", "ViT training images/s vs transformers' ViTForImageClassification (SDPA) at 3 and 12 heads", 70,
    measure_vision, vision_targets, vision_table))
