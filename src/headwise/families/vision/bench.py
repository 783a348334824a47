"""The ``vision`` section: training images/s of headwise's ViT against transformers'
``ViTForImageClassification`` with the same weights, at two head counts of tied head width.

The headwise models of every head count share one set of weights and one AdamW (the head count
changes no parameter shape when head_dim = d_model / heads); the Hugging Face models share a copy
of them made with :func:`headwise.hf.vit.to_hf_vit`, their own AdamW, and SDPA attention (the
fastest transformers offers on CPU). All cases are timed in the same interleaved rounds on one
batch of random images and labels, as the training sections are (:mod:`headwise.bench.core`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headwise.bench.cases import share_parameters
from headwise.bench.settings import BenchConfig
from headwise.bench.core import interleave, quiet_mask, rate_result, ratio_stats
from headwise.bench.training import make_optimizer
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

    def step() -> None:
        loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _models(cfg: BenchConfig, device: torch.device) -> tuple[dict[int, nn.Module], dict[int, nn.Module], list]:
    """headwise and Hugging Face models per head count, each side sharing one set of weights,
    and the two optimisers."""
    from transformers import ViTForImageClassification  # an optional extra; only this section needs it

    from headwise.hf.vit import to_hf_vit, to_vit_config

    counts = cfg.vision_heads
    torch.manual_seed(cfg.seed)
    base = Transformer(vision_spec(cfg, counts[0])).to(device).train()
    ours: dict[int, nn.Module] = {counts[0]: base}
    hf_base = to_hf_vit(base, attn_implementation=HF_ATTENTION).to(device).train()
    theirs: dict[int, nn.Module] = {counts[0]: hf_base}
    for h in counts[1:]:
        spec = vision_spec(cfg, h)
        with torch.device("meta"):
            twin = Transformer(spec)
            hf_twin = ViTForImageClassification(to_vit_config(spec))
        ours[h] = share_parameters(twin, base).train()
        hf_twin.set_attn_implementation(HF_ATTENTION)
        theirs[h] = share_parameters(hf_twin, hf_base).train()
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
    cases = {name: {**m, **rate_result(timings.seconds[name], timings.stall[name], batch, "images")}
             for name, m in meta.items()}
    spec = vision_spec(cfg, cfg.vision_heads[0])
    section = {
        "device": str(device), "precision": "fp32", "batch": batch, "image_size": cfg.vision_image_size,
        "patch_size": cfg.vision_patch_size, "channels": cfg.vision_channels, "d_model": cfg.vision_d_model,
        "n_layers": cfg.vision_layers, "mlp_hidden": cfg.vision_mlp_hidden, "num_classes": cfg.vision_classes,
        "positions": spec.max_seq_len, "heads": list(cfg.vision_heads), "rounds": cfg.vision_rounds,
        "warmup": cfg.vision_warmup, "params": count_params(spec),
        "hf_params": sum(p.numel() for p in theirs[cfg.vision_heads[0]].parameters()),
        "hf_attn_implementation": HF_ATTENTION,
        "optimizer": {k: opt.defaults.get(k) for k in ("lr", "betas", "weight_decay", "fused", "foreach")},
        "idle_wait_s": timings.waited,
        "cases": cases,
    }
    section["comparisons"] = compare_vision(section)
    return section


def compare_vision(section: dict[str, Any]) -> dict[str, Any]:
    """headwise / HF per head count, and the head-count penalty: headwise at the largest head
    count / at the smallest (each a median of per-round ratios, see :func:`ratio_stats`)."""
    c = section["cases"]

    def ratio(a: str, b: str) -> dict[str, Any]:
        both = quiet_mask(c[a]["cpu_stall"], c[b]["cpu_stall"])
        return ratio_stats(c[a]["images_per_s"], c[b]["images_per_s"], both)

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
