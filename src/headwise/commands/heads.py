"""``headwise heads``: the attention heads of a trained language run, scored one by one, and
pruned to a budget as a new, smaller run.

    headwise heads score runs/lm-tiny                                  -> runs/lm-tiny/heads/
    headwise heads score runs/llama --method gradient,ablation --tokens 4096 --out scores/
    headwise heads prune runs/lm-tiny --to heads:4 --out runs/lm-tiny-pruned
    headwise heads prune runs/llama --to params:1.2M --scope per-layer --scores runs/llama/heads/head_scores.json \
        --out runs/llama-uniform
    headwise train runs/lm-tiny-pruned/config.toml --out runs/healed --set train.init_from=runs/lm-tiny-pruned \
        --set train.distill.teacher=runs/lm-tiny
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.errors import HeadwiseError, OneLineParser
from headwise.paths import nearest_existing

if TYPE_CHECKING:
    from headwise.analysis.head_importance import HeadScores
    from torch import nn

    from headwise.spec import ModelSpec
    from headwise.text.tokenizer import Tokenizer
    from headwise.train.config import RunConfig

NAME = "heads"
HELP = "per-head importance of a language run's model (gradient, activation, ablation)"

#: what ``score`` writes, in its output folder
SCORES_JSON, SCORES_PNG = "head_scores.json", "head_scores.png"
#: heads named at each end of a method's ranking (at most half the heads each)
SHOWN = 5
#: what ``prune`` writes in the new run besides a run's files
PRUNED_JSON = "pruned.json"


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=OneLineParser)
    score = sub.add_parser("score", help="score every head of a run on its validation text",
                           description="Score every attention head of a language run (headwise train or convert) on "
                                       "its task's validation text: the gradient of the loss in a gate on the head's "
                                       "output (Michel et al. 2019), the head output's mean L2 norm (Minitron, "
                                       "Muralidharan et al. 2024), the loss increase with the head removed. "
                                       "Grouped-query layers also score each key/value group.")
    score.add_argument("run_dir", metavar="RUN", help="a language run directory")
    score.add_argument("--method", default="gradient,activation,ablation",
                       help="comma-separated methods: gradient, activation, ablation (default: all three; ablation "
                            "takes a pass over the data per head)")
    score.add_argument("--tokens", type=int, default=8192,
                       help="validation tokens to score on, in sequences of the run's block size (default "
                            "%(default)s)")
    score.add_argument("--out", type=Path, help=f"output folder (default RUN/heads): {SCORES_JSON}, {SCORES_PNG}")
    score.add_argument("--checkpoint", type=Path, metavar="PATH",
                       help="the checkpoint or model folder of the run to score (default: the final model)")
    prune = sub.add_parser("prune", help="remove the lowest-scoring heads to a budget, as a new run",
                           description="Remove a language run's lowest-scoring attention heads until the model meets "
                                       "a budget, and write the smaller model as a new run (its weights those of the "
                                       "heads that stay) that headwise trains (train.init_from), evaluates, exports "
                                       "and searches like any other. A grouped-query layer keeps its key/value heads "
                                       "and loses one query head from every group at a time; every layer keeps at "
                                       "least one head.")
    prune.add_argument("run_dir", metavar="RUN", help="a language run directory")
    prune.add_argument("--to", required=True, metavar="BUDGET",
                       help="the budget, a cap: heads:N (heads over the layers), params:N (or N alone), flops:N "
                            "(training FLOPs per token), kv-bytes:N (fp32 key/value cache bytes per token); N may end "
                            "in k, M or G (params:1.2M)")
    prune.add_argument("--out", required=True, type=Path, metavar="NEW_RUN",
                       help=f"the new run folder (must not exist, or be empty): a run's files and {PRUNED_JSON}")
    prune.add_argument("--method", default="gradient",
                       help="the score that ranks the heads: gradient (default), activation or ablation")
    prune.add_argument("--scope", default="global", choices=("global", "per-layer"),
                       help="global (default): heads compete across layers, which gives a per-layer allocation; "
                            "per-layer: the same number of heads goes from every layer (the uniform baseline)")
    prune.add_argument("--scores", type=Path, metavar="FILE",
                       help=f"rank by the scores of a {SCORES_JSON} that headwise heads score wrote for the weights "
                            "pruned (default: score them now)")
    prune.add_argument("--tokens", type=int, default=8192,
                       help="without --scores: validation tokens to score on (default %(default)s)")
    prune.add_argument("--checkpoint", type=Path, metavar="PATH",
                       help="the checkpoint or model folder of the run to prune (default: the final model)")


def _methods(text: str) -> tuple[str, ...]:
    from headwise.analysis.head_importance import METHODS

    methods = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise HeadwiseError(f"--method {text!r}: {'unknown method ' + repr(unknown[0]) if unknown else 'empty'}; "
                            f"use a comma-separated list of {', '.join(METHODS)}")
    return methods


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"--out {out} is a file: give a folder for the scores (it is created if missing)")
    existing = nearest_existing(out)
    if not existing.is_dir():
        raise HeadwiseError(f"--out {out}: {existing} is a file, so the folder cannot be made there")


def run(args: argparse.Namespace) -> int:
    """``heads score`` or ``heads prune``."""
    return prune_run(args) if args.action == "prune" else score_run(args)


def score_run(args: argparse.Namespace) -> int:
    """``heads score``: every head's scores, as a table, a heat map and a JSON record."""
    from headwise.analysis.head_importance import head_shapes, mean_loss, score_heads, validation_sample
    from headwise.analysis.plots import plot_head_scores
    from headwise.config import atomic_write_text
    from headwise.train.generate import load_run_model, run_config

    methods = _methods(args.method)
    if args.tokens < 1:
        raise HeadwiseError(f"--tokens {args.tokens}: give at least 1")
    run_dir = Path(args.run_dir)
    cfg = run_config(run_dir)
    out = args.out or run_dir / "heads"
    _check_out(out)
    inputs, targets, loss = validation_sample(run_dir, cfg, args.tokens)
    model, source = load_run_model(run_dir, args.checkpoint)
    shapes = head_shapes(model)
    scores = score_heads(model, inputs, targets, loss, methods)
    record = {
        "run": str(run_dir), "model": source, "weights_sha256": _weights_sha256(Path(source)),
        "sequences": inputs.shape[0], "sequence_length": inputs.shape[1], "tokens": inputs.numel(),
        "loss": mean_loss(model, inputs, targets, loss),
        "layers": [{"heads": s.heads, "head_dim": s.head_dim, "kv_heads": s.kv_heads} for s in shapes],
        "methods": {m: s.to_dict() for m, s in scores.items()},
    }
    atomic_write_text(out / SCORES_JSON, json.dumps(record, indent=2) + "\n")
    png = plot_head_scores({m: [list(layer.heads) for layer in s.layers] for m, s in scores.items()},
                           out / SCORES_PNG, title=f"Head importance: {run_dir.resolve().name}")
    print(format_scores(f"{source}: {inputs.shape[0]} sequences x {inputs.shape[1]} tokens, loss {record['loss']:.4f}",
                        scores))
    print(f"wrote {out / SCORES_JSON}, {png}")
    return 0


def format_scores(headline: str, scores: dict[str, HeadScores]) -> str:
    """The scores as text under ``headline``: per method, a row of head scores per layer (and of
    key/value group scores under a grouped layer), then the highest and lowest heads."""
    lines = [headline]
    for method, result in scores.items():
        lines += ["", method, f"{'layer':>5} {'heads':>5}  scores by head"]
        for i, layer in enumerate(result.layers):
            lines.append(f"{i:>5} {len(layer.heads):>5}  " + " ".join(f"{v:9.3g}" for v in layer.heads))
            if layer.groups is not None:
                lines.append(f"{'':>5} {'kv':>5}  " + " ".join(f"{v:9.3g}" for v in layer.groups))
        ranked = result.ranked()
        n = min(SHOWN, max(1, len(ranked) // 2))  # the two ends never share a head
        for label, part in (("top", ranked[:n]), ("bottom", ranked[::-1][:n])):
            lines.append(f"{label:>6}: " + ", ".join(f"L{i}.H{h} {v:.3g}" for v, i, h in part))
    return "\n".join(lines)


def prune_run(args: argparse.Namespace) -> int:
    """``heads prune``: the run's lowest-scoring heads removed to the budget, written as a new run."""
    from headwise.analysis.head_importance import head_shapes, score_heads, validation_sample
    from headwise.analysis.head_pruning import plan_pruning, prune_model, read_scores
    from headwise.budget import parse_budget
    from headwise.model.pretrained import WEIGHTS_FILE, weights_dtype
    from headwise.params import plan_budget
    from headwise.paths import refuse_unwritable_parent
    from headwise.train.generate import load_run_model, run_config
    from headwise.train.run_folder import check_new_run_folder

    budget = parse_budget(args.to)
    methods = _methods(args.method)
    if len(methods) != 1:
        raise HeadwiseError(f"--method {args.method}: heads are pruned by one method's scores; name one")
    if args.tokens < 1:
        raise HeadwiseError(f"--tokens {args.tokens}: give at least 1")
    out, run_dir = Path(args.out), Path(args.run_dir)
    check_new_run_folder(out)
    refuse_unwritable_parent("--out", out, "the run")  # written beside it, then renamed into place
    cfg = run_config(run_dir)
    if not cfg.task.family.generates_text:
        raise HeadwiseError(f"{run_dir} is a {cfg.task.kind!r} run: heads are pruned in a language run "
                            "(nothing was written)")
    tokenizer = cfg.task.run_tokenizer(run_dir)
    model, source = load_run_model(run_dir, args.checkpoint)
    shapes = head_shapes(model)
    if args.scores is not None:
        weights = (source, _weights_sha256(Path(source)))
        checkpoint = f" --checkpoint {args.checkpoint}" if args.checkpoint is not None else ""
        rescore = f"headwise heads score {run_dir}{checkpoint} --method {methods[0]}"
        scores, scored = read_scores(args.scores, methods[0], shapes, weights, rescore), {"file": str(args.scores)}
    else:
        inputs, targets, loss = validation_sample(run_dir, cfg, args.tokens)
        scores, scored = score_heads(model, inputs, targets, loss, methods)[methods[0]], {"tokens": inputs.numel()}
    seq_len = cfg.task.shape().seq_len

    def measure(spec: ModelSpec) -> int:
        return plan_budget(spec, seq_len, budget.dtype)[budget.metric]

    removed = plan_pruning(model.spec, scores, args.scope, measure, budget.max, budget.describe())
    # the source's own dtype (a converted bfloat16 run's stays bfloat16), as headwise export keeps it
    smaller = prune_model(model, removed).to(weights_dtype(Path(source) / WEIGHTS_FILE))
    spec = smaller.spec
    record = {"source": str(run_dir.resolve()), "model": source, "method": methods[0], "scores": scored,
              "scope": args.scope, "budget": budget.describe(), "removed": [list(r) for r in removed],
              "before": _counts(model.spec, seq_len), "after": _counts(spec, seq_len),
              "head_scores": scores.to_dict()}
    _write_pruned(out, smaller, _pruned_config(cfg, spec), tokenizer, record)
    gone = ", ".join(f"L{i}.H{h}" for i, r in enumerate(removed) for h in r)
    print(f"wrote {out}: {model.spec.heads_line()} -> {spec.heads_line()} by {methods[0]} scores ({args.scope}); "
          f"removed {gone}; {budget.metric} {measure(model.spec)} -> {measure(spec)} (budget {budget.describe()})")
    return 0


def _weights_sha256(folder: Path) -> str:
    """The sha256 of a saved model folder's weights file: its manifest's (which loading the folder
    has just checked the file against), else the file's own."""
    from headwise.config import sha256_file
    from headwise.model.pretrained import WEIGHTS_FILE, read_manifest

    entry = (read_manifest(folder) or {}).get(WEIGHTS_FILE)
    return entry["sha256"] if entry is not None else sha256_file(folder / WEIGHTS_FILE)


def _counts(spec: ModelSpec, seq_len: int) -> dict:
    """A spec's layers and every budget metric of it, as ``headwise search`` counts them."""
    from headwise.params import plan_budget

    layers = [{"heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim} for s in spec.layers()]
    return {"layers": layers, **plan_budget(spec, seq_len)}


def _pruned_config(cfg: RunConfig, spec: ModelSpec) -> RunConfig:
    """The source run's config with the pruned model as ``[model]`` (no preset or plan: the heads are
    the pruning's) and no ``init_from`` (the weights are the new run's), checked as ``headwise
    train`` resolves it: training this config builds exactly the pruned model."""
    from headwise.train.config import RunConfig, resolve_run_model, resolved_config

    data = cfg.to_dict()
    data["model"] = spec.to_dict()
    for key in ("init_from", "init_checkpoint"):
        data["train"].pop(key, None)
    pruned = RunConfig.parse(data, source="the pruned run's config")
    resolved, _ = resolve_run_model(pruned.to_dict(), source="the pruned run's config")
    if resolved != spec:
        raise HeadwiseError("the run's task changes the pruned model when its config is resolved: nothing was written")
    return resolved_config(pruned, spec)


def _write_pruned(out: Path, model: nn.Module, cfg: RunConfig, tokenizer: Tokenizer | None, record: dict) -> None:
    """The pruned run's files (as ``headwise convert`` writes a run: config, tokenizer, model, a
    step-0 checkpoint, a summary of 0 steps) and ``pruned.json``, written in a folder beside
    ``out`` and renamed into place, so a failure leaves nothing."""
    from headwise.plans import Plan
    from headwise.run.summary import RunStatus, RunSummary
    from headwise.run.tokenizer import tokenizer_record
    from headwise.train.run_folder import write_run_atomically

    spec = model.spec
    plan = Plan.explicit(spec.heads, spec.head_dims)
    plan = plan.with_kv_heads(spec.kv_heads_per_layer) if spec.kv_heads is not None else plan
    facts = {k: record[k] for k in ("source", "model", "method", "scope", "budget", "removed")}
    summary = RunSummary(status=RunStatus.COMPLETED, params=spec.parameter_count(), d_model=spec.d_model, plan=plan,
                         steps=0, total_steps=0, kv_cache_bytes_per_token=spec.kv_cache_budget(),
                         task={"task": cfg.task.kind, "data": f"pruned from {record['source']} by headwise heads "
                                                              "prune; not trained since", "pruned_from": facts},
                         tokenizer=tokenizer_record(tokenizer))
    write_run_atomically(out, model, cfg, tokenizer, summary, {PRUNED_JSON: json.dumps(record, indent=2) + "\n"})
