"""Replay a search's samplers against a table of every plan's loss: does TPE find better plans than random? (issue 44)

Each replayed search is the real thing but for the training: the search's own Optuna study
(:func:`headwise.search.store.open_study`, in memory: its :class:`PlanSampler` around TPE or random
sampling, seeded ``seed + trial number``), its first trials queued as the driver queues them
(:func:`headwise.search.driver.enqueue_named`: the named plans, then TPE's startup trials as
distinct plans drawn uniformly from the space's list), each trial's plan drawn and repaired as the driver
draws it (:func:`headwise.search.store.draw`), and told the loss ``benchmarks/sampler_table.py``
measured for that plan (a plan tried before is told the same loss, as the driver's duplicate
trials are). Trial n's draw depends only on the trials before it (and a search of fewer trials
queues the first of the same startup plans), so one replay of the largest trial count gives every
smaller count's search too.

For each trial count, sampler and search seed it records the best loss found, its rank among the
table's plans (1: the best plan) and how many trials repeated a plan already tried; it prints the
means over the seeds, the share of searches that found the best plan, and each sampler - random
(``--against``: another) per seed (paired by search seed) with a bootstrap 95% interval of its mean. ``tpe-random-start`` is
TPE as it was before: the driver queues no startup plans, so its first 10 trials are Optuna's
random startup (the random sampler's draws).
``uniform, distinct`` is the exact expectation for plans drawn uniformly without repeats (a rank's
expectation is (N + 1) / (T + 1)), the yardstick of an unbiased random search. The table's noise (plans run on
two seeds) is printed first: a difference between samplers smaller than it is luck of the table.

    python benchmarks/sampler_replay.py TABLE.csv progression --preset quick --seeds 20 --trials 8,16,24
"""

from __future__ import annotations

import csv
import dataclasses
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sampler_table import plan_key  # noqa: E402 - the table's names for plans

from headwise.errors import HeadwiseError, OneLineParser, guarded
from headwise.search import load_search  # noqa: E402
from headwise.search.driver import enqueue_named  # noqa: E402
from headwise.search.store import draw, open_study  # noqa: E402

SAMPLERS = ("tpe", "random", "tpe-random-start")


def read_table(path: Path) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """Each plan's loss (its first seed-0 run: the table study's, else the noise study's), and the
    (seed 0, seed 1) losses of the plans run on both seeds."""
    if not path.is_file():
        raise HeadwiseError(f"{path} does not exist: give the table.csv benchmarks/sampler_table.py wrote")
    by_plan: dict[str, dict[int, float]] = {}
    for r in csv.DictReader(path.open()):
        by_plan.setdefault(r["plan"], {}).setdefault(int(r["seed"]), float(r["loss"]))
    table = {plan: seeds[0] for plan, seeds in by_plan.items() if 0 in seeds}
    pairs = [(seeds[0], seeds[1]) for seeds in by_plan.values() if 0 in seeds and 1 in seeds]
    return table, pairs


def replay(search: Any, kind: str, seed: int, trials: int, loss: dict[str, float], named: bool) -> list[str]:
    """The plans (table keys) a ``kind`` search with seed ``seed`` tries in ``trials`` trials,
    each told its table loss."""
    config = search.config.model_copy(update={"seed": seed, "sampler": kind.split("-")[0], "trials": trials})
    search = dataclasses.replace(search, config=config)
    if not named:
        search = dataclasses.replace(search, named=[])
    study = open_study(search, optuna.storages.InMemoryStorage())
    enqueue_named(search, study, startup=kind != "tpe-random-start")
    tried = []
    for _ in range(trials):
        trial = study.ask()
        plan, _lr = draw(search, trial)
        study.sampler.repairs.pop(trial.number, None)
        key = plan_key(search.space.run_sets(plan))
        tried.append(key)
        study.tell(trial, loss[key])
    return tried


def uniform_distinct(losses: list[float], t: int) -> tuple[float, float]:
    """The expected best loss and rank of ``t`` plans drawn uniformly without repeats from
    ``losses``: the k-th best is the best with probability C(N - k, t - 1) / C(N, t)."""
    ordered, n = sorted(losses), len(losses)
    t = min(t, n)
    p = [math.comb(n - k, t - 1) / math.comb(n, t) for k in range(1, n + 1)]
    return sum(pk * v for pk, v in zip(p, ordered)), sum(pk * k for k, pk in enumerate(p, start=1))


def bootstrap_ci(diffs: list[float], reps: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the mean of ``diffs`` resampled with replacement."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(reps))
    return means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def summarise(tried: list[str], t: int, loss: dict[str, float], ordered: list[float]) -> dict[str, float]:
    """The first ``t`` trials of a search: best loss, its rank among all plans, repeated plans."""
    best = min(loss[k] for k in tried[:t])
    return {"best": best, "rank": 1 + sum(v < best for v in ordered), "dups": t - len(set(tried[:t])),
            "found": float(best == ordered[0])}


def report(results: dict[str, list[list[str]]], counts: list[int], loss: dict[str, float],
           against: str = "random") -> list[str]:
    """The markdown table of the replays, each sampler paired by search seed with ``against``."""
    ordered = sorted(loss.values())
    lines = [f"| trials | sampler | mean best loss | mean rank (of {len(ordered)}) | found the best | repeated plans | "
             f"- {against}, loss (95% CI) | - {against}, rank (95% CI) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for t in counts:
        stats = {k: [summarise(tried, t, loss, ordered) for tried in runs] for k, runs in results.items()}
        for kind, rows in stats.items():
            diff = ["", ""]
            if kind != against:
                for j, field in enumerate(("best", "rank")):
                    d = [a[field] - b[field] for a, b in zip(rows, stats[against])]
                    lo, hi = bootstrap_ci(d)
                    fmt = "{:+.4f}" if field == "best" else "{:+.1f}"
                    diff[j] = f"{fmt.format(statistics.fmean(d))} ({fmt.format(lo)}, {fmt.format(hi)})"
            lines.append(f"| {t} | {kind} | {statistics.fmean(r['best'] for r in rows):.4f} | "
                         f"{statistics.fmean(r['rank'] for r in rows):.1f} | "
                         f"{sum(r['found'] for r in rows):.0f}/{len(rows)} | "
                         f"{statistics.fmean(r['dups'] for r in rows):.1f} | {diff[0]} | {diff[1]} |")
        best, rank = uniform_distinct(ordered, t)
        lines.append(f"| {t} | uniform, distinct (exact) | {best:.4f} | {rank:.1f} | "
                     f"{min(t, len(ordered)) / len(ordered):.0%} | 0 | | |")
    return lines


def noise_lines(pairs: list[tuple[float, float]], loss: dict[str, float]) -> list[str]:
    """The table's noise against its spread."""
    values = list(loss.values())
    spread = statistics.stdev(values) if len(values) > 1 else float("nan")
    lines = [f"table: {len(values)} plans, best {min(values):.4f}, worst {max(values):.4f}, "
             f"sd across plans {spread:.4f}"]
    if len(pairs) > 1:
        run_sd = statistics.stdev(b - a for a, b in pairs) / math.sqrt(2)
        lines.append(f"noise: {len(pairs)} plans on two seeds, sd of one run {run_sd:.4f} "
                     f"({run_sd / spread:.2f} of the spread across plans)")
    return lines


@guarded("sampler_replay")
def main() -> int:
    """Replay the samplers on a table and print the comparison; the exit status."""
    parser = OneLineParser(prog="sampler_replay.py", description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="table.csv of benchmarks/sampler_table.py")
    parser.add_argument("search", help="the search whose space the table holds (a built-in search or a file)")
    parser.add_argument("--preset")
    parser.add_argument("--seeds", type=int, default=20, help="search seeds per sampler (default 20)")
    parser.add_argument("--trials", default="8,16,24", help="trial counts, comma-separated (default 8,16,24)")
    parser.add_argument("--no-named", action="store_true", help="do not queue the search's named plans first")
    parser.add_argument("--against", choices=SAMPLERS, default="random",
                        help="the sampler each other is paired with, by search seed (default random)")
    parser.add_argument("--missing", choices=["refuse", "median"], default="refuse",
                        help="a plan the table lacks: refuse (default), or give it the table's median loss")
    args = parser.parse_args()
    search = load_search(args.search, preset=args.preset)
    if search.space.config.lr or len(search.config.objectives) != 1 or search.config.objectives[0].from_budget:
        raise HeadwiseError("the replay needs a space without a learning rate and one measured objective")
    table, pairs = read_table(args.table)
    keys = [plan_key(search.space.run_sets(p)) for p in search.space.plans()]
    missing = [k for k in keys if k not in table]
    if missing and args.missing == "refuse":
        raise HeadwiseError(f"the table lacks {len(missing)} of the space's {len(keys)} plans (e.g. {missing[0]}): "
                 "complete it, or pass --missing median")
    median = statistics.median(table[k] for k in keys if k in table)
    loss = {k: table.get(k, median) for k in keys}
    counts = sorted(int(c) for c in args.trials.split(","))
    results = {kind: [replay(search, kind, s, counts[-1], loss, not args.no_named) for s in range(args.seeds)]
               for kind in SAMPLERS}
    hits = sum(k in missing for runs in results.values() for tried in runs for k in tried)
    print(f"search {search.name} ({search.preset or 'no preset'}), {args.seeds} search seeds per sampler, named plans "
          f"{'not ' if args.no_named else ''}queued first")
    for line in noise_lines(pairs, {k: table[k] for k in keys if k in table}):
        print(line)
    if missing:
        print(f"**{len(missing)} of {len(keys)} plans missing from the table, given the median {median:.4f}; "
              f"{hits} trials drew one**")
    print()
    print("\n".join(report(results, counts, loss, args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
