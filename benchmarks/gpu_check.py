"""A GPU check ready to run (``benchmarks/gpu_check.sh`` calls this): every family's paper-scale
model for a few dozen bf16 training steps, and CUDA-vs-CPU logits on a small model.

    python benchmarks/gpu_check.py --out DIR [--device cuda] [--steps 30] [--tiny]

Per model: training throughput (tokens or images a second: forward, cross-entropy against random
labels, backward, AdamW), MFU against the GPU's datasheet dense peak
(:data:`headwise.train.peak.GPU_PEAK_FLOPS`: NVIDIA's H100 / H200 SXM datasheets, 989 TFLOP/s dense
bf16 without sparsity; the FLOPs a unit are :func:`headwise.params.flops_per_token`), peak memory
(CUDA only), and the same for the transformers reference at the same shape where one exists
(GPT-Neo, Llama and ViT with headwise's weights, BERT with its own at the encoder's shape; OpenELM
and the Nystromformer LRA models have no transformers model class). Then the logits of
``llama-tiny`` on the device against the CPU's, in fp32.

``--device cpu --tiny`` runs every model at a tiny size (2 layers, width 64, 32 positions) on the
CPU in seconds: the tests run it so the script is known to work before a GPU is lent. Writes
``gpu_check.json`` and ``gpu_check.md`` under ``--out``. It records what it measured; it claims
nothing about machines it did not run on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headwise.errors import HeadwiseError, OneLineParser, guarded
from headwise.model import Transformer
from headwise.params import count_params, flops_per_token
from headwise.presets import preset_dict, spec_from_preset
from headwise.spec import ModelSpec
from headwise.train.peak import GPU_PEAK_FLOPS

#: the Nystromformer LRA reference model (families/lra/lra.toml's base model, 2 layers x 2 heads)
LRA_MODEL = dict(d_model=64, head_dim=32, heads=[2, 2], n_layers=2, mlp_hidden=128, activation="gelu", causal=False,
                 score_scale="inv_sqrt", qkv_bias=True, pooling="mean", classifier_hidden=128, landmarks=64,
                 attention="nystrom", outputs="classes")
#: a tiny size every model takes under ``--tiny`` (its own preset's other fields kept)
TINY = dict(n_layers=2, d_model=64, heads=[2, 2], head_dim=None, mlp_hidden=128)


@dataclass(frozen=True)
class Case:
    """One model checked: its spec's source, the batch size and positions (images: 1), and which
    transformers reference it is compared with (None: no reference class)."""

    name: str
    spec: Callable[[bool], ModelSpec]
    batch: int
    seq_len: int
    hf: str | None
    unit: str = "tokens"


def _preset(name: str, **fields: Any) -> Callable[[bool], ModelSpec]:
    def build(tiny: bool) -> ModelSpec:
        if not tiny:
            return spec_from_preset(name, **fields)
        base = preset_dict(name)
        # per-layer lists (attention kinds, windows, ...) cut to the tiny depth, then the tiny sizes
        cut = {k: v[:TINY["n_layers"]] for k, v in base.items() if isinstance(v, list) and len(v) == base["n_layers"]}
        extra = {"vocab_size": 256, "max_seq_len": 32} if name != "vit-b16" else \
            {"image_size": 32, "patch_size": 8, "num_classes": 10}
        if "kv_heads" in base or "kv_heads" in fields:
            extra |= {"kv_heads": 1}
        return spec_from_preset(name, **{**fields, **cut, **TINY, **extra})
    return build


def _lra(vocab: int, max_seq_len: int, classes: int) -> Callable[[bool], ModelSpec]:
    def build(tiny: bool) -> ModelSpec:
        fields = {**LRA_MODEL, "vocab_size": vocab, "max_seq_len": max_seq_len, "num_classes": classes}
        if tiny:
            fields |= {"max_seq_len": 128, "landmarks": 16}
        return ModelSpec.parse(fields, source="gpu_check lra")
    return build


def cases() -> list[Case]:
    """The paper-scale models, each at its paper's sequence length (the LRA models' vocabularies
    and position tables as ``families/lra/lra.toml``'s paper preset sets them)."""
    return [
        Case("blog GPT-Neo 4x12 (68.5M)", _preset("blog-gpt-neo"), 16, 512, "gpt-neo"),
        Case("blog-llama 4x12 GQA 4", _preset("blog-llama", kv_heads=4), 16, 512, "llama"),
        Case("OpenELM-270M", _preset("openelm-270m"), 8, 1024, None),
        Case("crammed-bert 16x12", _preset("crammed-bert"), 64, 128, "bert"),
        Case("ViT-B/16", _preset("vit-b16"), 64, 1, "vit", unit="images"),
        Case("LRA ListOps 2x2 Nystrom", _lra(32, 2048, 10), 32, 2000, None),
        Case("LRA Text 2x2 Nystrom", _lra(512, 4096, 2), 32, 1000, None),
        Case("LRA Image/Pathfinder 2x2 Nystrom", _lra(512, 1024, 10), 128, 1024, None),
    ]


def example(spec: ModelSpec, batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """A random input batch: images [B, C, H, W], else token ids [B, T]."""
    g = torch.Generator().manual_seed(0)
    if spec.inputs == "images":
        return torch.randn(batch, spec.channels, spec.image_size, spec.image_size, generator=g).to(device)
    return torch.randint(0, spec.vocab_size, (batch, min(seq_len, spec.max_seq_len)), generator=g).to(device)


def hf_reference(kind: str, model: Transformer) -> tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """transformers' model at ``model``'s shape and its logits function."""
    if kind == "gpt-neo":
        from headwise.hf.gpt_neo import GPT_NEO
        hf = GPT_NEO.to_hf(model)
    elif kind == "llama":
        from headwise.hf.llama import LLAMA
        hf = LLAMA.to_hf(model)
        hf.set_attn_implementation("sdpa")
    elif kind == "vit":
        from headwise.hf.vit import VIT
        hf = VIT.to_hf(model)
        return hf.train(), lambda x: hf(pixel_values=x).logits
    else:  # BERT at the encoder's shape, its own weights (the bench's encoder section's model)
        from transformers import BertConfig, BertForMaskedLM
        s = model.spec
        hf = BertForMaskedLM(BertConfig(vocab_size=s.vocab_size, hidden_size=s.d_model, num_hidden_layers=s.n_layers,
                                        num_attention_heads=s.heads[0], intermediate_size=3 * s.layer(0).mlp_hidden // 4,
                                        max_position_embeddings=s.max_seq_len, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0))
        hf.set_attn_implementation("sdpa")
    return hf.train(), lambda x: hf(input_ids=x).logits


def time_training(forward: Callable[[torch.Tensor], torch.Tensor], params: list[torch.nn.Parameter], x: torch.Tensor,
                  steps: int, warmup: int, device: torch.device, dtype: torch.dtype | None) -> dict[str, Any]:
    """Seconds a step (median) of forward, cross-entropy against random labels, backward, AdamW;
    the peak memory on CUDA."""
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")
    labels: torch.Tensor | None = None
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + steps):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            logits = forward(x)
        if labels is None:
            labels = torch.randint(0, logits.shape[-1], logits.shape[:-1], device=device)
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    out = {"step_s": times[len(times) // 2]}
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The datasheet dense peak of a known GPU; None on the CPU (MFU is not reported there)."""
    if device.type != "cuda":
        return None, "no datasheet peak for a CPU"
    name = torch.cuda.get_device_name(device)
    for key, peaks in GPU_PEAK_FLOPS.items():
        if key in name:
            return peaks[precision], f"NVIDIA datasheet dense {precision} peak of {key}"
    return None, f"no datasheet peak known for {name}"


def check_case(case: Case, args: argparse.Namespace, device: torch.device, peak: float | None) -> dict[str, Any]:
    """Train ``case`` (and its reference) for ``args.steps`` steps; the row of the result."""
    spec = case.spec(args.tiny)
    batch = 2 if args.tiny else case.batch
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    torch.manual_seed(0)
    model = Transformer(spec).to(device).train()
    x = example(spec, batch, case.seq_len, device)
    units = batch * (1 if case.unit == "images" else x.shape[1])
    per_unit = flops_per_token(spec, 1 if case.unit == "images" else x.shape[1])
    row: dict[str, Any] = {"model": case.name, "params": count_params(spec), "batch": batch, "unit": case.unit,
                           "seq_len": None if case.unit == "images" else x.shape[1], "flops_per_unit": per_unit}

    def rate(timed: dict[str, Any]) -> dict[str, Any]:
        per_s = units / timed["step_s"]
        return {**timed, f"{case.unit}_per_s": per_s, "mfu": None if peak is None else per_s * per_unit / peak}

    row["headwise"] = rate(time_training(model, list(model.parameters()), x, args.steps, args.warmup, device, dtype))
    if case.hf is None:
        row["hf"] = {"skipped": "no transformers model class for this architecture"}
    else:
        try:
            hf, forward = hf_reference(case.hf, model.cpu())
            hf = hf.to(device)
            row["hf"] = {"class": type(hf).__name__, **rate(time_training(forward, list(hf.parameters()), x,
                                                                         args.steps, args.warmup, device, dtype))}
            row["headwise_over_hf"] = row["hf"]["step_s"] / row["headwise"]["step_s"]
            del hf
        except Exception as err:  # a reference that cannot be built is recorded, not fatal
            row["hf"] = {"skipped": f"{type(err).__name__}: {err}"}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def logits_check(device: torch.device) -> dict[str, Any]:
    """``llama-tiny``'s fp32 logits on ``device`` against the CPU's (TF32 off), on one random batch."""
    torch.manual_seed(0)
    model = Transformer(spec_from_preset("llama-tiny")).eval()
    x = torch.randint(0, model.spec.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            got = model.to(device)(x.to(device)).cpu()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
    diff = (got - ref).abs().max().item()
    return {"model": "llama-tiny", "device": str(device), "max_abs_diff": diff,
            "greedy_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean()), "ok": diff < 1e-3}


def markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table."""
    lines = [f"# GPU check ({result['device_name']}, {result['precision']}, {result['steps']} steps)", "",
             f"MFU against {result['peak_source']}" + (f" ({result['peak_flops'] / 1e12:.0f} TFLOP/s)."
                                                       if result["peak_flops"] else "."), "",
             "| model | params | batch | units/s | MFU | peak GiB | HF units/s | HF MFU | headwise / HF |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    for r in result["models"]:
        h, f = r["headwise"], r["hf"]
        unit = f"{r['unit']}_per_s"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['batch']} | {cell(h[unit], ',.0f')} | {cell(h['mfu'], '.1%')} | "
                     f"{cell(h.get('peak_memory_gib'), '.1f')} | {cell(f.get(unit), ',.0f') if 'skipped' not in f else 'none'} | "
                     f"{cell(f.get('mfu'), '.1%')} | {cell(r.get('headwise_over_hf'), '.2f')} |")
    lc = result["logits"]
    lines += ["", f"Logits of {lc['model']} on {lc['device']} vs the CPU (fp32): max |diff| {lc['max_abs_diff']:.2e}, "
                  f"greedy tokens agree {lc['greedy_agree']:.1%}.", ""]
    return "\n".join(lines)


@guarded("gpu_check")
def main(argv: list[str] | None = None) -> int:
    """Run the check and write ``gpu_check.json`` and ``gpu_check.md`` under ``--out``."""
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="default: bf16 on CUDA, else fp32")
    parser.add_argument("--tiny", action="store_true", help="every model at a tiny size (for the tests, on a CPU)")
    parser.add_argument("--only", help="run only the models whose name contains this")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HeadwiseError("CUDA is not available: pass --device cpu --tiny to try it on the CPU")
    if args.tiny:
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    args.precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    peak, source = peak_flops(device, args.precision)
    result: dict[str, Any] = {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision, "steps": args.steps, "warmup": args.warmup, "tiny": args.tiny,
        "peak_flops": peak, "peak_source": source, "torch": torch.__version__, "models": []}
    start = time.perf_counter()
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        print(f"[gpu_check] {case.name}", flush=True)
        result["models"].append(check_case(case, args, device, peak))
    result["logits"] = logits_check(device)
    result["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
