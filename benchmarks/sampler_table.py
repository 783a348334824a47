"""Train every plan of a search's space once, at the search's trial fidelity: a lookup table plan -> loss (issue 44).

A search's space is sometimes small enough to enumerate (the progression search's quick preset:
108 plans meet its budget). Then every plan is trained once, and a sampler can be replayed against
the table (``benchmarks/sampler_replay.py``) for as many search seeds as one likes, at no cost.

The plans are trained through headwise's own machinery: the script writes two study files, whose
base run config is the search's trials' own (``Search.base``: its steps, data, learning rate and
``[fidelity] set``) and whose variants set each plan's layers (``PlanSpace.run_sets``), and runs
``headwise study FILE --out DIR`` on them (resumable: rerun the same command to go on):

- ``DIR/table``: every plan, one seed, in a seeded random order (so that the plans a stopped
  table holds are a random sample of the space);
- ``DIR/noise``: ``--noise`` plans spread over the space, two seeds (its seed 0 repeats the
  table's run: the pair says whether a rerun reproduces it, seed 1 how far a fresh seed moves it).

A study's runs train with ``train.seed`` = 0, 1, ..., not the search's ``[fidelity] run_seed``:
the table is one draw of each plan's noise, as a search's trial is. Then ``DIR/table.csv`` is
written (``--collect`` writes it from whatever runs have finished, without training):

    plan,heads,seed,loss,study,wall_s,run_dir

    python benchmarks/sampler_table.py progression --preset quick --out /work/scratch/sampler --jobs 2 --threads 1
    python benchmarks/sampler_table.py progression --preset quick --out DIR --limit 4 --set train.steps=4   # a smoke test
"""

from __future__ import annotations

import csv
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

from headwise.errors import OneLineParser, RunFailure, guarded
from headwise.plans import Plan
from headwise.search import load_search

#: what a plan's run config sets beside its heads, and how its key names it
KEYS = {"model.head_dim": "hd", "model.kv_heads": "kv", "model.mlp_hidden": "mlp"}
COLUMNS = ["plan", "heads", "seed", "loss", "study", "wall_s", "run_dir"]


def plan_key(sets: dict[str, Any]) -> str:
    """A plan's name in the table (and its study variant's): ``h6-12-24-48``, with ``.kv..``,
    ``.hd..``, ``.mlp..`` for what else the space sets; ``sets`` is ``PlanSpace.run_sets(plan)``."""
    parts = ["h" + "-".join(map(str, sets["model.heads"]))]
    parts += [tag + "-".join(f"{v:g}" for v in sets[key]) for key, tag in KEYS.items() if key in sets]
    return ".".join(parts)


def study_file(search: Any, plans: list[Plan], name: str, seeds: int) -> dict[str, Any]:
    """A study of ``plans`` at the search's trial fidelity, ``seeds`` seeds each."""
    base = {k: v for k, v in search.base.items()}
    base["train"] = {k: v for k, v in base["train"].items() if k != "seed"}  # the study sets it
    variants = [{"name": plan_key(search.space.run_sets(p)), "set": search.space.run_sets(p)} for p in plans]
    return {"name": name, "description": f"every plan of search {search.name} ({search.preset}) at its trials' fidelity",
            "seeds": seeds, "base": base, "variants": variants}


def spread(plans: list[Plan], k: int) -> list[Plan]:
    """``k`` plans evenly spaced over the space's order (its depth-first enumeration)."""
    k = min(k, len(plans))
    return [plans[i * len(plans) // k] for i in range(k)] if k else []


def run_study(path: Path, out: Path, jobs: int, threads: int) -> int:
    """``headwise study path --out out`` (resumes a study already there); its exit status."""
    cmd = ["headwise", "study", str(path), "--out", str(out), "--jobs", str(jobs), "--threads", str(threads),
           "--no-report"]
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def collect(out: Path) -> list[dict[str, Any]]:
    """The finished runs of ``out/table`` and ``out/noise`` as table rows."""
    rows = []
    for study in ("table", "noise"):
        results = out / study / "results.csv"
        if not results.is_file():
            continue
        for r in csv.DictReader(results.open()):
            if r["status"] == "completed" and r["final_eval_loss"]:
                rows.append({"plan": r["variant"], "heads": r["heads"].replace(" ", ","), "seed": int(r["seed"]),
                             "loss": float(r["final_eval_loss"]), "study": study, "wall_s": float(r["wall_time_s"]),
                             "run_dir": str(out / study / r["run_dir"])})
    return rows


def write_table(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


@guarded("sampler_table")
def main() -> int:
    """Train the table's plans (or only collect them); the exit status."""
    parser = OneLineParser(prog="sampler_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("search", help="a built-in search or a search file")
    parser.add_argument("--preset")
    parser.add_argument("--out", type=Path, required=True, help="the folder of the studies and table.csv")
    parser.add_argument("--noise", type=int, default=12, help="plans trained on a second seed too (default 12)")
    parser.add_argument("--limit", type=int, help="only the space's first N plans (a smoke test)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the search's base (a smoke test: train.steps=4)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--collect", action="store_true", help="only write table.csv from the finished runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.collect:
        search = load_search(args.search, preset=args.preset, overrides=args.set)
        plans = list(search.space.plans(limit=args.limit))
        shuffled = random.Random(0).sample(plans, len(plans))
        print(f"search {search.name} ({search.preset}): {len(plans)} plans, {args.noise} of them on two seeds",
              flush=True)
        label = f"sampler-{search.name}-{search.preset or 'default'}"
        for study, chosen, seeds in (("table", shuffled, 1), ("noise", spread(plans, args.noise), 2)):
            if not chosen:
                continue
            path = args.out / f"{study}.toml"
            text = tomli_w.dumps(study_file(search, chosen, f"{label}-{study}", seeds))
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
            if run_study(path, args.out / study, args.jobs, args.threads):
                raise RunFailure(f"the {study} study stopped before its end: rerun this command to go on")
    rows = collect(args.out)
    write_table(rows, args.out / "table.csv")
    print(f"{args.out / 'table.csv'}: {len(rows)} runs, {len({r['plan'] for r in rows})} plans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
