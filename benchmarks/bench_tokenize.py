"""Tokenization throughput of the ``gpt-neo`` tokenizer on the shared TinyStories train sample.

    python3 benchmarks/bench_tokenize.py [--data DIR] [--repeats 5] [--out result.json]

Reads the sample's stories the way a cache build does, then times
``Tokenizer.encode_documents`` (batch encoding on every core, end-of-text after each story) over
several repeats and reports the best and median tokens per second as JSON (target: >= 1M/s on a
2-core CPU). The data folder is ``--data``, else ``$HEADWISE_DATA``, else ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from headwise.data.sources import open_source
from headwise.data.tokenizer import gpt_neo_tokenizer

SAMPLE = "tinystories-train-sample.txt"


def data_dir(given: str | None) -> Path:
    """The folder holding the shared samples."""
    if given:
        return Path(given)
    if os.environ.get("HEADWISE_DATA"):
        return Path(os.environ["HEADWISE_DATA"])
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder holding tinystories-train-sample.txt")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args(argv)

    path = data_dir(args.data) / SAMPLE
    if not path.is_file():
        print(f"bench_tokenize: {path} not found: pass --data or set HEADWISE_DATA", file=sys.stderr)
        return 2
    stories = list(open_source(str(path)).documents())
    tokenizer = gpt_neo_tokenizer()
    tokenizer.encode_documents(stories[:64])  # warm-up: thread pool and caches

    times, tokens = [], 0
    for _ in range(args.repeats):
        start = time.perf_counter()
        tokens = len(tokenizer.encode_documents(stories))
        times.append(time.perf_counter() - start)
    result = {
        "benchmark": "tokenize",
        "tokenizer": tokenizer.spec,
        "data": str(path),
        "stories": len(stories),
        "characters": sum(len(s) for s in stories),
        "tokens": tokens,
        "repeats": args.repeats,
        "seconds_best": round(min(times), 4),
        "tokens_per_second_best": round(tokens / min(times)),
        "tokens_per_second_median": round(tokens / statistics.median(times)),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
