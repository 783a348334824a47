"""How much the evaluation text's format moves a language study's losses and its ranking (issue 44).

Scores every completed run of a study whose runs held out ``fraction:F`` of the training stories,
or half of it (``fraction:F:1/2``, as the LM verdict presets do), on
four evaluation sets, each at every block (``task.eval_batches = 0``), with the run's own tokenizer:

- ``part 1``: the first half of the hold-out, whole stories with their end-of-text separators (the
  training text's format; what the LM verdicts now report on);
- ``part 2``: the other half (what their tuning now selects on);
- ``part 1 as a stream``: part 1's stories joined by blank lines, no separators (the validation
  sample's format, the same stories: the format alone);
- ``validation sample``: the bundled blank-line-joined validation text (what the verdicts reported
  on before: other stories and that format).

Prints a markdown report: each set's mean loss per variant, Spearman's rho of the variants'
means between the sets, and each plan's paired difference from the baseline at each setting.

    headwise study benchmarks/eval_format_study.toml --out DIR     # 18 runs, ~1 h on 2 cores
    python benchmarks/eval_format.py DIR [--baseline constant] [--seeds 0,1] [--out FILE]
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from scipy.stats import spearmanr

from headwise.errors import HeadwiseError, OneLineParser, guarded
from headwise.text.data_plan import DataConfig, parse_validation, plan_data
from headwise.train.generate import run_config
from headwise.train.held_out import held_out_scores


def _stream_of_part(run_dir: Path, part: str, out: Path) -> Path:
    """``part``'s stories of the run's training source, joined by blank lines (the validation
    sample's layout), written once to ``out``."""
    if not out.is_file():
        task = run_config(run_dir).task
        plan = plan_data(DataConfig(source=task.source, validation=part, seed=task.seed))
        out.write_text("\n\n".join(text for role, text in plan.documents() if role == "valid") + "\n",
                       encoding="utf-8")
    return out


@guarded("eval_format")
def main() -> int:
    """Score the study's runs on the four sets and print the report; the exit status."""
    parser = OneLineParser(prog="eval_format.py", description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--baseline", default="constant", help="the scheme the others are compared with")
    parser.add_argument("--out", type=Path, help="write the report here too")
    parser.add_argument("--seeds", help="only these seeds, e.g. 0,1 (default: every completed run)")
    args = parser.parse_args()
    results = args.study / "results.csv"
    if not results.is_file():
        raise HeadwiseError(f"{args.study} has no results.csv: give the folder of a finished study")
    rows = [r for r in csv.DictReader(open(results)) if r["status"] == "completed"
            and (args.seeds is None or r["seed"] in args.seeds.split(","))]
    if not rows:
        raise HeadwiseError(f"{results} lists no completed run{' of seeds ' + args.seeds if args.seeds else ''}")
    first = args.study / rows[0]["run_dir"]
    validation = run_config(first).task.validation
    kind, holdout = parse_validation(validation)
    if kind != "fraction" or holdout.parts not in (1, 2):
        raise HeadwiseError(f"the runs must hold out 'fraction:F' or its halves 'fraction:F:K/2', not {validation!r}")
    part1, part2 = f"fraction:{holdout.fraction:g}:1/2", f"fraction:{holdout.fraction:g}:2/2"
    stream = _stream_of_part(first, part1, args.study / "part1-stream.txt")
    sets = {
        "part 1 (stories)": {"task.validation": part1},
        "part 2 (stories)": {"task.validation": part2},
        "part 1 as a stream": {"task.validation": str(stream)},
        "validation sample (stream)": {"task.validation": "tinystories-valid-sample.txt"},
    }
    # variant -> set -> seed -> loss
    scores: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        for name, overrides in sets.items():
            loss = held_out_scores(args.study / r["run_dir"], {**overrides, "task.eval_batches": 0})["loss"]
            scores[r["variant"]][name][r["seed"]] = loss
    variants = sorted(scores)
    lines = [f"# Evaluation format: {args.study.name} ({len(rows)} runs, seeds per variant: "
             f"{len(next(iter(scores.values()))['part 1 (stories)'])})", "",
             "Mean loss per variant over its seeds, every block of each set:", "",
             "| variant | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    means = {v: {s: statistics.mean(scores[v][s].values()) for s in sets} for v in variants}
    lines += [f"| {v} | " + " | ".join(f"{means[v][s]:.4f}" for s in sets) + " |" for v in variants]
    names = list(sets)
    lines += ["", "Spearman's rho of the variants' mean losses between two sets (1: the same order):", "",
              "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for a in names:
        lines.append(f"| {a} | " + " | ".join(
            f"{spearmanr([means[v][a] for v in variants], [means[v][b] for v in variants]).statistic:.3f}"
            for b in names) + " |")
    lines += ["", f"Paired difference from `{args.baseline}` at the same other settings (loss - baseline's, mean "
              "over the seeds both have), per set:", "",
              "| variant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for v in variants:
        scheme, _, rest = v.partition("-")
        base = f"{args.baseline}-{rest}"
        if scheme == args.baseline or base not in scores:
            continue
        cells = []
        for s in names:
            seeds = sorted(set(scores[v][s]) & set(scores[base][s]))
            cells.append(f"{statistics.mean(scores[v][s][k] - scores[base][s][k] for k in seeds):+.4f}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    shift = [means[v]["part 1 as a stream"] - means[v]["part 1 (stories)"] for v in variants]
    lines += ["", f"The format alone (part 1 as a stream minus part 1 as stories): {statistics.mean(shift):+.4f} on "
              f"average, from {min(shift):+.4f} to {max(shift):+.4f} across variants."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
