"""``headwise bench``: run the performance suite and write ``latest.json`` and ``latest.md``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


NAME = "bench"
HELP = "measure training/generation speed against Hugging Face GPT-Neo (JSON + markdown table)"


def _sections(text: str) -> list[str]:
    from headwise.bench.sections import section_names

    known = section_names()
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown section(s) {bad or [text]}; choose from {', '.join(known)}")
    return names


def _seq_lens(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of sequence lengths >= 2")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _epilog() -> str:
    from headwise.bench.sections import ordered_sections

    return "sections: " + "; ".join(f"{s.name}: {s.help}" + ("" if s.by_default else " (only with --only)")
                                    for s in ordered_sections())


def configure(p: argparse.ArgumentParser) -> None:
    """The options of ``headwise bench``."""
    p.epilog = _epilog  # listing the sections imports them (and torch): only for --help
    p.add_argument("--quick", action="store_true",
                   help="smoke-sized run (~1-2 min on 2 idle cores): vocab 8192, 512 tokens per step, "
                        "3 rounds, 100 generated tokens")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                   help="folder for latest.json and latest.md (default: benchmarks/results)")
    p.add_argument("--only", type=_sections, metavar="SECTIONS",
                   help="comma-separated subset of the sections (below, or --list)")
    p.add_argument("--seq-lens", type=_seq_lens, metavar="T,T", help="sequence lengths (default 256,512)")
    p.add_argument("--rounds", type=_positive, help="timed rounds, every case once per round (default 5; quick 3)")
    p.add_argument("--tokens-per-step", type=_positive, help="B x T per training step (default 1024; quick 512)")
    p.add_argument("--gen-tokens", type=_positive, help="new tokens to generate (default 500; quick 100)")
    p.add_argument("--threads", type=_positive, help="torch threads (default: torch's, one per core)")
    p.add_argument("--list", action="store_true", help="list the sections and what each measures, then stop")


def run(args: argparse.Namespace) -> int:
    """Run the suite as the options say and write ``latest.json`` and ``latest.md`` under ``--out``
    (``--list``: print the sections instead)."""
    if args.list:
        from headwise.bench.sections import ordered_sections

        for section in ordered_sections():
            print(f"{section.name:10} {section.help}" + ("" if section.by_default else " (only with --only)"))
        return 0
    import dataclasses

    from headwise.bench import BenchConfig, run_bench, tune_cpu_allocator, write_results
    from headwise.errors import HeadwiseError

    if args.out.exists() and not args.out.is_dir():
        raise HeadwiseError(f"--out {args.out} exists and is not a folder")
    cfg = BenchConfig.quick_config() if args.quick else BenchConfig()
    overrides = {k: v for k, v in (("seq_lens", args.seq_lens), ("rounds", args.rounds),
                                   ("tokens_per_step", args.tokens_per_step),
                                   ("gen_new_tokens", args.gen_tokens), ("threads", args.threads))
                 if v is not None}
    if args.seq_lens and max(args.seq_lens) > 2048:
        raise HeadwiseError(f"--seq-lens {max(args.seq_lens)} is longer than the model's 2048 positions")
    cfg = dataclasses.replace(cfg, **overrides)
    tune_cpu_allocator()  # this process only: both sides of every comparison run in it
    result = run_bench(cfg, set(args.only) if args.only else None,
                       log=lambda msg: print(msg, file=sys.stderr, flush=True))
    result["command"] = "headwise " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "headwise bench"
    js, md = write_results(result, args.out)
    print(md.read_text())
    print(f"wrote {js} and {md}")
    return 0
