"""``headwise plan``: per-layer heads for a scheme and budget, with widths and parameter count."""

from __future__ import annotations

import argparse
import json

from headwise.config import finite_float
from headwise.errors import HeadwiseError
from headwise.params import count_params, kv_cache_budget
from headwise.plans import SCHEMES, plan_heads, plan_kv_heads
from headwise.spec import ModelSpec

NAME = "plan"
HELP = "turn a head scheme and a budget into per-layer head counts"


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _float_pair(text: str) -> tuple[float, float]:
    try:
        values = tuple(finite_float(v) for v in text.split(","))
    except argparse.ArgumentTypeError:
        values = ()
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not two comma-separated numbers (first layer, last layer), "
                                         "each finite")
    return values  # type: ignore[return-value]


#: the ``layerwise`` scheme's flags, by their keyword in :func:`headwise.plans.layerwise_scaling`
_LAYERWISE_FLAGS = {"qkv_multipliers": "--qkv-multipliers", "ffn_multipliers": "--ffn-multipliers",
                    "gqa_groups": "--gqa-groups", "ffn_divisor": "--ffn-divisor"}

#: the block OpenELM's layer-wise scaled models are made of (counted by ``--scheme layerwise``)
_OPENELM_BLOCK = dict(activation="swiglu", norm="rmsnorm_pre", positions="rope", qk_norm="rmsnorm",
                      score_scale="inv_sqrt", qkv_bias=False, out_bias=False, mlp_bias=False)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--scheme", choices=SCHEMES, default="constant")
    p.add_argument("--total-heads", type=int, help="the budget of heads over all layers")
    p.add_argument("--ratio", type=finite_float, default=2.0, help="geometric ratio per layer (linear: last/first)")
    p.add_argument("--heads", type=_int_list, help="explicit per-layer counts, e.g. 96,48,24,12")
    p.add_argument("--head-dim", type=int, help="fixed head width (decoupled from d_model / heads)")
    p.add_argument("--kv-heads", type=_int_list, help="key/value heads (grouped-query attention): one count for "
                   "every layer or one per layer, e.g. 2 or 4,2,2,1; each layer's heads must be a multiple")
    p.add_argument("--kv-group", type=int, help="query heads per key/value head in every layer (GQA; 1: multi-head)")
    p.add_argument("--kv-scheme", choices=("constant", "ascending", "descending", "linear"),
                   help="spread --kv-total key/value heads over the layers, each a divisor of its layer's heads")
    p.add_argument("--kv-total", type=int, help="the budget of key/value heads over all layers (with --kv-scheme)")
    p.add_argument("--kv-ratio", type=finite_float, default=2.0, help="--kv-scheme's ratio (as --ratio)")
    p.add_argument("--qkv-multipliers", type=_float_pair, help="layerwise: the first and last layers' query-width "
                   "multipliers of d_model (default 0.5,1.0, OpenELM's)")
    p.add_argument("--ffn-multipliers", type=_float_pair, help="layerwise: the first and last layers' SwiGLU "
                   "inner-width multipliers of d_model (default 0.5,4.0, OpenELM's)")
    p.add_argument("--gqa-groups", type=int, help="layerwise: query heads per key/value head (default 4)")
    p.add_argument("--ffn-divisor", type=int, help="layerwise: SwiGLU inner widths are multiples of it (default 256)")
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--mlp-hidden", type=int, help="MLP width (default 4 x d_model)")
    p.add_argument("--untied", action="store_true", help="untied output embedding")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _check_args(args: argparse.Namespace) -> None:
    """Refuse flags the scheme would silently ignore, and a missing budget, in the flags' own words."""
    given = [flag for key, flag in _LAYERWISE_FLAGS.items() if getattr(args, key) is not None]
    if args.scheme == "layerwise":
        for flag, value in (("--heads", args.heads), ("--total-heads", args.total_heads),
                            ("--kv-heads", args.kv_heads), ("--kv-group", args.kv_group),
                            ("--kv-scheme", args.kv_scheme), ("--mlp-hidden", args.mlp_hidden)):
            if value is not None:
                raise HeadwiseError(f"{flag} does not apply to --scheme layerwise: its multipliers set the query "
                                    "and key/value heads and the MLP widths of every layer")
        return
    if given:
        raise HeadwiseError(f"{given[0]} applies only to --scheme layerwise")
    kv_plan = [flag for flag, value in (("--kv-group", args.kv_group), ("--kv-scheme", args.kv_scheme),
                                        ("--kv-total", args.kv_total)) if value is not None]
    if kv_plan and args.kv_heads is not None:
        raise HeadwiseError(f"--kv-heads gives the counts themselves: drop {kv_plan[0]}, or --kv-heads")
    if args.kv_group is not None and (args.kv_scheme or args.kv_total) is not None:
        raise HeadwiseError("give --kv-group, or --kv-scheme with --kv-total, not both")
    if (args.kv_scheme is None) != (args.kv_total is None):
        raise HeadwiseError("--kv-scheme and --kv-total go together: the scheme spreads that many key/value heads")
    if args.scheme == "explicit":
        if args.total_heads is not None:
            raise HeadwiseError("--total-heads does not apply to --scheme explicit: the --heads list sets the total")
        return
    if args.heads is not None:
        raise HeadwiseError(f"--heads gives the counts themselves: use it with --scheme explicit, or give "
                            f"--total-heads for --scheme {args.scheme}")
    if args.total_heads is None:
        raise HeadwiseError(f"--scheme {args.scheme} needs --total-heads N, the budget of heads over all "
                            f"{args.layers} layers (e.g. --total-heads {4 * max(args.layers, 1)})")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    layerwise = {key: getattr(args, key) for key in _LAYERWISE_FLAGS if getattr(args, key) is not None}
    plan = plan_heads(args.scheme, args.layers, args.d_model, args.total_heads, ratio=args.ratio, heads=args.heads,
                      head_dim=args.head_dim, layerwise=layerwise)
    if args.kv_group is not None or args.kv_scheme is not None:
        plan = plan.with_kv_heads(*plan_kv_heads(plan.heads, group=args.kv_group, scheme=args.kv_scheme,
                                                 total=args.kv_total, ratio=args.kv_ratio))
    kv = list(plan.kv_heads) or args.kv_heads
    block = _OPENELM_BLOCK if plan.mlp_hidden else {}
    spec = ModelSpec.parse(dict(
        vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.layers, max_seq_len=args.max_seq_len,
        heads=list(plan.heads), head_dim=args.head_dim, mlp_hidden=list(plan.mlp_hidden) or args.mlp_hidden,
        tie_embeddings=not args.untied, kv_heads=kv[0] if kv is not None and len(kv) == 1 else kv, **block,
    ), source="plan")
    params = count_params(spec)
    kv_cache = kv_cache_budget(spec)  # a plan's model is causal: it decodes with a key/value cache
    # the KV heads as the spec resolves them, per layer, and the MLP widths; shown only when asked
    # for or set by the scheme, so that the output of a plan without them stays as it was
    kv_heads = spec.kv_heads_per_layer if kv is not None else None
    mlp = list(plan.mlp_hidden) or None
    if args.json:
        extra = {} if kv_heads is None else {"kv_heads": kv_heads}
        print(json.dumps({**plan.to_dict(), "total_heads": plan.total, "attention_widths": list(plan.widths),
                          "exact": plan.exact, **extra, "params": params,
                          "kv_cache_bytes_per_token": kv_cache}))
        return 0
    print(f"scheme {plan.scheme}, d_model {args.d_model}, {args.layers} layers")
    kv_column = "" if kv_heads is None else f" {'kv heads':>9}"
    mlp_column = "" if mlp is None else f" {'mlp width':>10}"
    print(f"{'layer':>5} {'heads':>6}{kv_column} {'head_dim':>9} {'attn width':>11}{mlp_column}")
    for i, (h, hd, w) in enumerate(zip(plan.heads, plan.head_dims, plan.widths)):
        kv_cell = "" if kv_heads is None else f" {kv_heads[i]:>9}"
        mlp_cell = "" if mlp is None else f" {mlp[i]:>10}"
        print(f"{i:>5} {h:>6}{kv_cell} {hd:>9} {w:>11}{mlp_cell}")
    print(f"total heads {plan.total}" + ("" if plan.exact else f" (requested {plan.requested_total})")
          + ("" if kv_heads is None else f", {sum(kv_heads)} key/value heads"))
    print(f"parameters {params:,}")
    print(f"KV cache: {kv_cache['fp32']:,} bytes per token (fp32), {kv_cache['bf16']:,} (bf16)")
    if mlp is not None:
        print("note: an mlp width counts the SwiGLU's value and gate halves; OpenELM's FFN width is half of it")
    for note in plan.notes:
        print(f"note: {note}")
    return 0
