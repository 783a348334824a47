"""``headwise generate``: continue a prompt with a trained run's model (or an untrained one).

    headwise generate runs/lm-tiny --prompt "Once upon a time there was" --temperature 0.9 --max-new-tokens 500
    headwise generate runs/lm-tiny --prompt "Once upon a time" --untrained --seed 0
    headwise generate runs/nearest-tiny           # other runs: the model's answers on held-out data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from headwise.config import finite_float

NAME = "generate"
HELP = "sample text from a run's model (KV cache), or show another model's answers on held-out data"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by headwise train")
    p.add_argument("--prompt", help=f"text to continue (default {DEFAULTS['prompt']!r})")
    p.add_argument("--temperature", type=finite_float, help=f"0 decodes greedily (default {DEFAULTS['temperature']})")
    p.add_argument("--max-new-tokens", type=int, help=f"at most this many tokens (default {DEFAULTS['max_new_tokens']})")
    p.add_argument("--top-k", type=int, help="sample only from the K most likely tokens")
    p.add_argument("--top-p", type=finite_float, help="sample only from the smallest set of tokens with probability >= P")
    p.add_argument("--seed", type=int, help="seed for sampling (and for --untrained initialisation)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", metavar="PATH", help="a checkpoint or model folder (default: the final model)")
    which.add_argument("--untrained", action="store_true", help="a freshly initialised model of the run's spec")
    p.add_argument("--json", action="store_true", help="print one JSON object")


#: the text options and their defaults (a vector run takes none of them)
DEFAULTS = {"prompt": "Once upon a time there was", "temperature": 0.9, "max_new_tokens": 200, "top_k": None,
            "top_p": None}


def _check_sampling(args: argparse.Namespace) -> None:
    from headwise.errors import HeadwiseError

    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.max_new_tokens < 1:
        raise HeadwiseError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if args.temperature < 0:
        raise HeadwiseError(f"--temperature {args.temperature}: give 0 (greedy) or a positive number")
    if args.top_k is not None and args.top_k < 1:
        raise HeadwiseError(f"--top-k {args.top_k}: give at least 1 (or leave it out to sample from every token)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise HeadwiseError(f"--top-p {args.top_p}: give a probability in (0, 1]")


def run(args: argparse.Namespace) -> int:
    from headwise.errors import HeadwiseError
    from headwise.train.generate import generate_text, held_out_predictions, load_run_model, run_config, run_task

    given = [f"--{name.replace('_', '-')}" for name in DEFAULTS if getattr(args, name) is not None]
    _check_sampling(args)
    run_dir = Path(args.run_dir)
    cfg = run_config(run_dir)
    writes_text = cfg.task.family.generates_text
    if not writes_text and given:
        raise HeadwiseError(f"{run_dir} is a {cfg.task.kind!r} run: its model does not write text, so "
                            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} nothing to do; leave "
                            f"{'it' if len(given) == 1 else 'them'} out to see the model's predictions")
    if writes_text:
        text, source = generate_text(run_dir, args.prompt, args.max_new_tokens, temperature=args.temperature,
                                     top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                     checkpoint=args.checkpoint, untrained=args.untrained)
        if args.json:
            print(json.dumps({"model": source, "prompt": args.prompt, "text": text}))
        else:
            print(f"[{source}]")
            print(args.prompt + text)
        return 0
    model, source = load_run_model(run_dir, Path(args.checkpoint) if args.checkpoint else None,
                                   args.untrained, args.seed)
    task = run_task(run_dir, cfg)  # a text task's held-out rows in the run's own vocabulary
    result = {"model": source, **held_out_predictions(model, task, task.eval_batches()[0])}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"[{source}] held-out batch: {result['metric']} {result['accuracy']:.3f}, loss {result['loss']:.4f}")
    print(f"{result['shown']}, the model's: {result['predicted']}")
    print(f"{result['shown']}, the targets: {result['target']}")
    return 0
