"""Throughput ratios of two sets of ``headwise bench`` results, section by section.

    python3 benchmarks/compare_bench.py --before A1/latest.json A2/latest.json --after B1/latest.json B2/latest.json

For every measured case present in all the runs (each ``*_per_s`` list's median, each
``*per_s_median``), the ratio is the mean of the ``--after`` runs over the mean of the ``--before``
runs; each section prints the cases' count and geometric mean, lowest and highest ratio. Run the
two sides alternated in one sitting on an idle machine (docs/speed.md).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headwise.errors import HeadwiseError, OneLineParser, guarded

SECTIONS = ("training", "generation", "tokenize", "llama", "decode", "vision", "nystrom", "encoder")


def throughputs(result: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    """Every throughput figure of one bench result, by its path in the JSON."""
    items = result.items() if isinstance(result, dict) else enumerate(result) if isinstance(result, list) else ()
    for key, value in items:
        key = str(key)
        if isinstance(value, (int, float)) and (key.endswith("per_s_median") or key == "tokens_per_second_best"):
            yield path + (key,), float(value)
        elif isinstance(value, list) and value and key.endswith("per_s") and all(
                isinstance(x, (int, float)) for x in value):
            yield path + (key,), statistics.median(value)
        else:
            yield from throughputs(value, path + (key,))


def ratios(before: list[Any], after: list[Any]) -> dict[str, list[float]]:
    """After / before per case, grouped by section; only cases every run measured (above zero)."""
    runs = [dict(throughputs({s: r[s] for s in SECTIONS if s in r})) for r in before + after]
    common = set.intersection(*(set(r) for r in runs))
    out: dict[str, list[float]] = {}
    for case in sorted(common):
        old, new = [r[case] for r in runs[:len(before)]], [r[case] for r in runs[len(before):]]
        if min(old + new) > 0:
            out.setdefault(case[0], []).append(statistics.mean(new) / statistics.mean(old))
    return out


def _load(path: Path) -> Any:
    """One ``latest.json``; a missing or unreadable file is bad input, in one line."""
    try:
        result = json.loads(path.read_text())
        return result, f"torch {result['machine']['torch']}, {result['machine']['cpu']}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeadwiseError(f"{path} is not a headwise bench result (latest.json): {exc}") from None


@guarded("compare_bench")
def main(argv: list[str] | None = None) -> int:
    """Print the ratios of the ``--after`` runs over the ``--before`` runs; the exit status."""
    parser = OneLineParser(prog="compare_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True, help="latest.json of the old side's runs")
    parser.add_argument("--after", nargs="+", type=Path, required=True, help="latest.json of the new side's runs")
    args = parser.parse_args(argv)
    runs = {side: [(p, *_load(p)) for p in getattr(args, side)] for side in ("before", "after")}
    for side, loaded in runs.items():
        for path, _, machine in loaded:
            print(f"{side}: {path} ({machine})")
    print("| section | cases | geometric mean | lowest | highest |\n|---|---|---|---|---|")
    before, after = ([r for _, r, _ in runs[side]] for side in ("before", "after"))
    for section, rs in ratios(before, after).items():
        mean = math.exp(statistics.mean(math.log(x) for x in rs))
        print(f"| {section} | {len(rs)} | {mean:.2f} | {min(rs):.2f} | {max(rs):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
