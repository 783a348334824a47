"""Tokenization throughput of the ``gpt-neo`` tokenizer on the shared TinyStories train sample.

    python -m headwise.families.lm.bench [--data DIR] [--repeats 5] [--out result.json]

Reads the sample's stories the way a cache build does, then times
``Tokenizer.encode_documents`` (batch encoding on every core, end-of-text after each story) over
several repeats and reports the best and median tokens per second as JSON (target: >= 1M/s on a
2-core CPU). The data folder is ``--data``, else ``$HEADWISE_DATA``, else ``../shared/data`` from
the current folder (the layout ``.ci/run`` uses, run from the repository root).

The ``tokenize`` section of ``headwise bench`` (registered here) runs this module as a
subprocess (:func:`bench_tokenize`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headwise.bench.report import target
from headwise.bench.sections import BenchSection, SuiteRun, of_part, register_section
from headwise.data.sources import data_root, open_source
from headwise.families.lm import bench_llama  # noqa: F401  (registers the llama and decode sections)
from headwise.text.tokenizer import gpt_neo_tokenizer

SAMPLE = "tinystories-train-sample.txt"


def data_dir(given: str | None, default: Path | None = None) -> Path:
    """The folder holding the shared samples: ``given``, else ``$HEADWISE_DATA``, else ``default``,
    else ``../shared/data`` from the current folder."""
    if given:
        return Path(given)
    return data_root() or default or Path.cwd().parent / "shared" / "data"


def measure(path: Path, repeats: int) -> dict[str, Any]:
    """Time ``repeats`` encodings of every story in ``path``; the JSON-ready result."""
    stories = list(open_source(str(path)).documents())
    tokenizer = gpt_neo_tokenizer()
    tokenizer.encode_documents(stories[:64])  # warm-up: thread pool and caches

    times, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = len(tokenizer.encode_documents(stories))
        times.append(time.perf_counter() - start)
    return {
        "benchmark": "tokenize",
        "tokenizer": tokenizer.spec,
        "data": str(path),
        "stories": len(stories),
        "characters": sum(len(s) for s in stories),
        "tokens": tokens,
        "repeats": repeats,
        "seconds_best": round(min(times), 4),
        "tokens_per_second_best": round(tokens / min(times)),
        "tokens_per_second_median": round(tokens / statistics.median(times)),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None, default_data: Path | None = None) -> int:
    """Run the measurement and print (and optionally write) its JSON result; ``default_data`` is
    the data folder used when neither ``--data`` nor ``$HEADWISE_DATA`` names one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder holding tinystories-train-sample.txt")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args(argv)

    path = data_dir(args.data, default_data) / SAMPLE
    if not path.is_file():
        print(f"bench_tokenize: {path} not found: pass --data or set HEADWISE_DATA", file=sys.stderr)
        return 2
    text = json.dumps(measure(path, args.repeats), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def bench_tokenize(repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The ``tokenize`` section: :func:`main` in a fresh process, so that neither the benchmark's
    allocator tuning nor the memory its models hold changes what a tokenizing job would see.
    A failure is recorded as ``{"skipped": why}``."""
    log("[tokenize] python -m headwise.families.lm.bench")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tokenize.json"
        proc = subprocess.run([sys.executable, "-m", "headwise.families.lm.bench", "--repeats", str(repeats),
                               "--out", str(out)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            return {"skipped": f"headwise.families.lm.bench failed: {why}"}
        return json.loads(out.read_text())


def measure_tokenize(run: SuiteRun) -> None:
    """The ``tokenize`` section."""
    run.result["tokenize"] = bench_tokenize(run.cfg.tokenize_repeats, run.log)


@of_part("tokenize")
def tokenize_targets(tok: dict[str, Any]) -> list[dict[str, Any]]:
    """GPT-Neo tokenization at 1M tokens/s or more."""
    rate = tok.get("tokens_per_second_median")
    return [target("GPT-Neo tokenization", ">= 1M tokens/s", rate, rate is not None and rate >= 1e6,
                   f"{rate / 1e6:.2f}M tokens/s" if rate else f"skipped: {tok.get('skipped')}")]


@of_part("tokenize")
def tokenize_table(tok: dict[str, Any]) -> list[str]:
    """Tokens, stories and tokens/s (median and best), or why the section was skipped."""
    lines = ["## Tokenization (GPT-Neo, headwise.families.lm.bench)", ""]
    if "skipped" in tok:
        lines.append(f"skipped: {tok['skipped']}")
    else:
        lines += ["| tokens | stories | median tok/s | best tok/s |", "|---|---|---|---|",
                  f"| {tok['tokens']:,} | {tok['stories']:,} | {tok['tokens_per_second_median']:,} | "
                  f"{tok['tokens_per_second_best']:,} |"]
    lines.append("")
    return lines


register_section(BenchSection("tokenize", "GPT-Neo tokenization tokens/s (headwise.families.lm.bench)", 60,
                              measure_tokenize, tokenize_targets, tokenize_table))


if __name__ == "__main__":
    sys.exit(main())
