"""The ``nystrom`` section: forward + backward tokens/s of one Nyström attention layer against
softmax attention and against transformers' ``NystromformerSelfAttention``, with the same weights.

A layer is the qkv projection, the attention and the output projection: headwise's
:class:`headwise.model.transformer.Attention` with ``attention = "nystrom"`` (d_model 64, 2 heads
of width 32, 64 landmarks, 6 pseudo-inverse iterations, no convolution, bidirectional, scores
times 1/sqrt(head_dim), biases on both projections), the same module with ``attention =
"global"`` (softmax attention through SDPA) sharing its parameters, and transformers'
``NystromformerSelfAttention`` followed by a ``Linear`` (its ``NystromformerSelfOutput.dense``,
without the residual LayerNorm) holding copies of them: query/key/value are the three row blocks
of headwise's fused qkv weight, the dense layer its output projection. transformers' module
needs its input length equal to its ``segment_means_seq_len``, so there is one per length, all
sharing one set of weights; its convolution is switched off (the module's ``conv_kernel_size``
set to None) and its pseudo-inverse start set to the per-head coefficient headwise uses (any
``init_option`` but ``"original"``), so both compute the same function (``max_abs_diff`` in the
result, one forward at every length).

One sample is ``repeats`` forward + backward passes (a fixed random output gradient, gradients
of the input and of the weights, then released), ``repeats`` picked per case after the warm-up
so that a sample lasts about ``nystrom_sample_s`` (a Nyström pass at 1k tokens takes a
millisecond or two, a softmax pass at 4k tokens hundreds). Every case of every length is timed
in the same interleaved rounds (:func:`headwise.bench.core.interleave`); ratios are medians of
per-round ratios.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headwise.bench.cases import meta_twin
from headwise.bench.core import case_ratio, interleave, synchronize
from headwise.bench.report import number, quiet_count, ratio_cell, ratio_shown, target
from headwise.bench.sections import BenchSection, SuiteRun, of_part, register_section
from headwise.bench.settings import BenchConfig
from headwise.model.transformer import Attention
from headwise.spec import ModelSpec

#: the cases timed at every length, as named in results (``"headwise nystrom T=1024"``)
IMPLS = ("headwise nystrom", "headwise softmax", "hf nystrom")
#: most passes in one sample
MAX_REPEATS = 256


def nystrom_spec(cfg: BenchConfig, attention: str = "nystrom") -> ModelSpec:
    """The one-layer vector model whose layer 0 is the benchmark's attention layer."""
    return ModelSpec(
        inputs="vectors", d_model=cfg.nystrom_d_model, n_layers=1, heads=[cfg.nystrom_heads],
        max_seq_len=max(cfg.nystrom_seq_lens), attention=[attention], causal=False, score_scale="inv_sqrt",
        qkv_bias=True, out_bias=True, landmarks=cfg.nystrom_landmarks,
        pinv_iterations=cfg.nystrom_pinv_iterations, nystrom_conv=None,
    )


class HFNystromLayer(nn.Module):
    """transformers' ``NystromformerSelfAttention`` (conv off) and an output ``Linear``: the same
    computation as headwise's nystrom :class:`Attention` (q, k, v, out projections with bias)."""

    def __init__(self, cfg: BenchConfig, seq_len: int):
        super().__init__()
        from transformers import NystromformerConfig  # an optional extra; only this section needs it
        from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention

        config = NystromformerConfig(
            hidden_size=cfg.nystrom_d_model, num_attention_heads=cfg.nystrom_heads,
            num_landmarks=cfg.nystrom_landmarks, segment_means_seq_len=seq_len, conv_kernel_size=3,
            attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
        self.attention = NystromformerSelfAttention(config)
        # its conv is always built from the config; None switches it off in forward (and the
        # unused weights go, so that the parameters are the same as headwise's)
        self.attention.conv_kernel_size = None
        del self.attention.conv
        # not "original": one pinv coefficient per sample and head, as headwise's default
        self.attention.init_option = "per_head"
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.attention(x)[0])


def copy_to_hf(ours: Attention, theirs: HFNystromLayer) -> None:
    """Copy headwise's fused qkv and output projections into transformers' query/key/value and dense."""
    w = ours.width
    att = theirs.attention
    with torch.no_grad():
        for i, lin in enumerate((att.query, att.key, att.value)):
            lin.weight.copy_(ours.qkv.weight[i * w:(i + 1) * w])
            lin.bias.copy_(ours.qkv.bias[i * w:(i + 1) * w])
        theirs.dense.weight.copy_(ours.out.weight)
        theirs.dense.bias.copy_(ours.out.bias)


def _layers(cfg: BenchConfig, device: torch.device) -> tuple[Attention, Attention, dict[int, HFNystromLayer]]:
    """headwise's nystrom layer, its softmax twin sharing its parameters, and transformers' layer
    per length sharing one copy of them."""
    torch.manual_seed(cfg.seed)
    spec = nystrom_spec(cfg)
    ours = Attention(spec, spec.layer(0)).to(device).train()
    soft_spec = nystrom_spec(cfg, "global")
    softmax = meta_twin(lambda: Attention(soft_spec, soft_spec.layer(0)), ours).train()
    lengths = list(cfg.nystrom_seq_lens)
    hf_base = HFNystromLayer(cfg, lengths[0]).to(device).train()
    copy_to_hf(ours, hf_base)
    theirs = {lengths[0]: hf_base}
    for t in lengths[1:]:
        theirs[t] = meta_twin(lambda: HFNystromLayer(cfg, t), hf_base).train()
    return ours, softmax, theirs


def make_pass(layer: Callable[[torch.Tensor], torch.Tensor], params: list[nn.Parameter], x: torch.Tensor,
              grad: torch.Tensor) -> Callable[[], None]:
    """One forward + backward pass of ``layer`` on ``x`` (which requires grad) with output gradient
    ``grad``; the gradients are released after it."""

    def run() -> None:
        layer(x).backward(grad)
        x.grad = None
        for p in params:
            p.grad = None

    return run


def repeated(fn: Callable[[], None], repeats: int) -> Callable[[], None]:
    """``fn`` called ``repeats`` times: one sample."""

    def run() -> None:
        for _ in range(repeats):
            fn()

    return run


def pick_repeats(fn: Callable[[], None], target_s: float, device: torch.device) -> int:
    """Passes per sample so that a sample lasts about ``target_s`` (one timed call of ``fn``)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(MAX_REPEATS, round(target_s / once)))


def case_name(impl: str, t: int) -> str:
    return f"{impl} T={t}"


def bench_nystrom(cfg: BenchConfig, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Time forward + backward of the three layers at every length, interleaved."""
    ours, softmax, theirs = _layers(cfg, device)
    batch, d = cfg.nystrom_batch, cfg.nystrom_d_model
    g = torch.Generator().manual_seed(cfg.seed)
    prefix = f"[{device.type} fp32 nystrom B={batch}]"

    passes: dict[str, Callable[[], None]] = {}
    meta: dict[str, dict[str, Any]] = {}
    diffs: dict[int, dict[str, float]] = {}
    for t in cfg.nystrom_seq_lens:
        x = torch.randn(batch, t, d, generator=g).to(device).requires_grad_()
        grad = torch.randn(batch, t, d, generator=g).to(device)
        hf = theirs[t]
        layers = {"headwise nystrom": (ours, list(ours.parameters())),
                  "headwise softmax": (softmax, list(softmax.parameters())),
                  "hf nystrom": (hf, list(hf.parameters()))}
        with torch.no_grad():
            out = {impl: layer(x) for impl, (layer, _) in layers.items()}
        diffs[t] = {"hf": (out["headwise nystrom"] - out["hf nystrom"]).abs().max().item(),
                    "softmax": (out["headwise nystrom"] - out["headwise softmax"]).abs().max().item()}
        for impl, (layer, params) in layers.items():
            name = case_name(impl, t)
            passes[name] = make_pass(layer, params, x, grad)
            meta[name] = dict(impl=impl, seq_len=t)

    for w in range(cfg.nystrom_warmup):
        for name, fn in passes.items():
            log(f"{prefix} warm-up {w + 1}/{cfg.nystrom_warmup}: {name}")
            fn()
    steps: dict[str, Callable[[], None]] = {}
    for name, fn in passes.items():
        meta[name]["repeats"] = pick_repeats(fn, cfg.nystrom_sample_s, device)
        steps[name] = repeated(fn, meta[name]["repeats"])
    timings = interleave(steps, cfg.nystrom_rounds, 0, device, seed=cfg.seed + 11,
                         idle_wait=cfg.nystrom_idle_wait, progress=lambda s: log(f"{prefix} {s}"))
    cases = {name: {**m, **timings.rates(name, batch * m["seq_len"] * m["repeats"])} for name, m in meta.items()}
    section = {
        "device": str(device), "precision": "fp32", "batch": batch, "seq_lens": list(cfg.nystrom_seq_lens),
        "d_model": d, "heads": cfg.nystrom_heads, "head_dim": d // cfg.nystrom_heads,
        "landmarks": cfg.nystrom_landmarks, "pinv_iterations": cfg.nystrom_pinv_iterations, "conv": None,
        "pinv_init": "per_head", "softmax_attention": "headwise Attention, attention = global (SDPA)",
        "hf_module": "transformers NystromformerSelfAttention (conv_kernel_size None) + Linear",
        "rounds": cfg.nystrom_rounds, "warmup": cfg.nystrom_warmup, "sample_s": cfg.nystrom_sample_s,
        "softmax_target_from": cfg.nystrom_softmax_target_from,
        "params": sum(p.numel() for p in ours.parameters()),
        "hf_params": sum(p.numel() for p in theirs[cfg.nystrom_seq_lens[0]].parameters()),
        "max_abs_diff": {str(t): v for t, v in diffs.items()},
        "idle_wait_s": timings.waited,
        "cases": cases,
    }
    section["comparisons"] = compare_nystrom(section)
    return section


def compare_nystrom(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Per length: headwise nystrom / hf nystrom and headwise nystrom / headwise softmax (each a
    median of per-round ratios, see :func:`~headwise.bench.core.ratio_stats`)."""
    c = section["cases"]
    rows = []
    for t in section["seq_lens"]:
        ours, softmax, hf = (case_name(impl, t) for impl in IMPLS)
        rows.append({"seq_len": t,
                     "vs_hf": {"reference": hf, **case_ratio(c, ours, hf)},
                     "vs_softmax": {"reference": softmax, **case_ratio(c, ours, softmax)}})
    return rows


def measure_nystrom(run: SuiteRun) -> None:
    """The ``nystrom`` section on the CPU."""
    run.result["nystrom"] = bench_nystrom(run.cfg, torch.device("cpu"), run.log)
    run.snapshot("after nystrom")


@of_part("nystrom")
def nystrom_targets(nys: dict[str, Any]) -> list[dict[str, Any]]:
    """At every length, headwise's layer at least as fast as HF's; from ``softmax_target_from`` on,
    faster than softmax attention."""
    targets = []
    for row in nys["comparisons"]:
        t, hf, soft = row["seq_len"], row["vs_hf"], row["vs_softmax"]
        targets.append(target(f"Nyström layer vs HF NystromformerSelfAttention, fwd+bwd tokens/s, T={t}: "
                              f"headwise / HF", ">= 1.0x", hf["ratio"], hf["ratio"] >= 1.0, ratio_shown(hf)))
        if t >= nys["softmax_target_from"]:
            targets.append(target(f"Nyström layer vs softmax attention (SDPA), fwd+bwd tokens/s, T={t}: "
                                  f"nystrom / softmax", "> 1.0x", soft["ratio"], soft["ratio"] > 1.0,
                                  ratio_shown(soft)))
    return targets


@of_part("nystrom")
def nystrom_table(n: dict[str, Any]) -> list[str]:
    """The three layers' tokens/s and ratios per length, and the difference from HF's output."""
    comp = {r["seq_len"]: r for r in n["comparisons"]}
    cases = n["cases"]
    lines = [f"## Nyström attention layer, forward + backward ({n['device']}, {n['precision']}, B={n['batch']})", "",
             f"One layer: qkv projection, attention, output projection (with biases); d_model {n['d_model']}, "
             f"{n['heads']} heads of width {n['head_dim']}, {n['landmarks']} landmarks, {n['pinv_iterations']} "
             "pseudo-inverse iterations (per-head start), no conv. Softmax = the same headwise module with "
             "attention = global (SDPA), same weights; HF = transformers NystromformerSelfAttention (conv off) + "
             "Linear, a copy of the weights. A sample is several passes (forward, backward to the input and the "
             f"weights); waited {n.get('idle_wait_s', 0):.0f} s in all for the machine to go quiet before rounds.", "",
             "| T | quiet | headwise nyström tok/s | softmax tok/s | HF nyström tok/s | nyström / HF | "
             "nyström / softmax | max abs diff vs HF |",
             "|---|---|---|---|---|---|---|---|"]
    for t in n["seq_lens"]:
        ours, soft, hf = (cases[case_name(impl, t)] for impl in IMPLS)
        lines.append(f"| {t} | {quiet_count(ours)} | {number(ours['tokens_per_s_median'])} | "
                     f"{number(soft['tokens_per_s_median'])} | {number(hf['tokens_per_s_median'])} | "
                     f"{ratio_cell(comp[t]['vs_hf'])} | {ratio_cell(comp[t]['vs_softmax'])} | "
                     f"{n['max_abs_diff'][str(t)]['hf']:.1e} |")
    lines.append("")
    return lines


register_section(BenchSection(
    "nystrom", "one Nystrom attention layer, forward + backward tokens/s at 1k-4k tokens, vs softmax attention "
               "and transformers' NystromformerSelfAttention", 80, measure_nystrom, nystrom_targets, nystrom_table))

