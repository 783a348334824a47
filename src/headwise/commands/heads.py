"""``headwise heads``: the attention heads of a trained language run, scored one by one.

    headwise heads score runs/lm-tiny                                  -> runs/lm-tiny/heads/
    headwise heads score runs/llama --method gradient,ablation --tokens 4096 --out scores/
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

NAME = "heads"
HELP = "per-head importance of a language run's model (gradient, activation, ablation)"

#: what ``score`` writes, in its output folder
SCORES_JSON, SCORES_PNG = "head_scores.json", "head_scores.png"
#: heads named at each end of a method's ranking (at most half the heads each)
SHOWN = 5


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
    """``heads score`` (the one action so far)."""
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
    model, source = load_run_model(run_dir)
    shapes = head_shapes(model)
    scores = score_heads(model, inputs, targets, loss, methods)
    record = {
        "run": str(run_dir), "model": source, "sequences": inputs.shape[0], "sequence_length": inputs.shape[1],
        "tokens": inputs.numel(), "loss": mean_loss(model, inputs, targets, loss),
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
