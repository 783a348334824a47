"""``headwise search``: search for a head allocation under a budget (Optuna), resumably, then confirm.

    headwise search progression --preset quick
    headwise search progression --preset verdict --jobs 2
    headwise search my-search.toml --trials 40 --storage sqlite:////shared/optuna.db
    headwise search my-search.toml --storage sqlite:////shared/optuna.db --worker   # a second driver
    headwise search progression --preset tiny --jobs 4 --backend ray --address auto   # trials on a Ray cluster
    headwise search --list

Every check happens before anything is written (the space against the budget, the objectives,
``--out``, a ``--storage`` URL and its driver, the device, the data; with ``--backend ray`` the
last two on the cluster, with Ray installed, an ``--address`` that answers and the search folder
seen by every node): bad input is one line and exit 2. ``--dry-run`` prints the space, the number of plans that meet the budget and the named
plans, and writes nothing. At the end the search's report is written (``headwise.search.report``).
"""

from __future__ import annotations

import argparse

from headwise.commands.study import add_backend_options, listed

NAME = "search"
HELP = "search for the heads per layer (depth, widths, KV heads) under a budget with Optuna, resumably, then confirm"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("search", nargs="?", metavar="NAME|FILE", help="a built-in search (see --list) or a search .toml file")
    p.add_argument("--preset", help="the search's preset (built-in searches: quick, tiny, verdict; default tiny)")
    p.add_argument("--out", metavar="DIR", help="search folder (default searches_out/NAME-PRESET)")
    p.add_argument("--jobs", type=int, help="trials at a time (default: the search's, else 1)")
    add_backend_options(p, "trial", "search")
    p.add_argument("--trials", type=int, help="trials over the whole search, named plans included (default: the "
                   "search's); a rerun with more continues it")
    p.add_argument("--storage", metavar="URL", help="the Optuna store, a database URL (default: sqlite optuna.db in "
                   "the search folder); several drivers on one store share the search")
    p.add_argument("--worker", action="store_true", help="join the search started in --out: only run its trials (its "
                   "driver confirms it)")
    p.add_argument("--new", action="store_true", help="start afresh in an --out holding a search defined otherwise "
                   "(its files move into --out/previous-N/)")
    p.add_argument("--no-confirm", action="store_true", help="skip the confirmation study after the trials")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base run config, e.g. --set train.device=cpu (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the space, its feasible plans and the named plans; "
                   "write nothing")
    p.add_argument("--list", action="store_true", help="list the built-in searches and their presets")


def describe(search) -> str:  # noqa: ANN001 - a headwise.search.definition.Search
    """What ``--dry-run`` prints: the space, the budget, the feasible plans, the named plans."""
    space, config = search.space, search.config
    count = space.count()
    budget = config.budget.describe() if config.budget else "none"
    lines = [f"search {search.name}" + (f" (preset {search.preset})" if search.preset else "")
             + f": {search.config.trials} trials of {search.base['train']['steps']} steps, seed {config.seed}",
             f"  space: depth {space.depths[0]}" + (f"..{space.depths[-1]}" if len(space.depths) > 1 else "")
             + f"; {space.size()} plans before the budget; {space.parametrisation()}",
             f"  budget: {budget}; plans that meet it: " + (f"{count}" if count is not None else "more than can be counted")
             + (f" (depths {', '.join(map(str, space.feasible_depths))})" if len(space.depths) > 1 else ""),
             "  objectives: " + ", ".join(f"{o.metric} ({o.direction})" for o in config.objectives)
             + "; " + {"tpe": "TPE", "nsga2": "NSGA-II", "random": "random sampling"}[config.sampler_kind]
             + (f"; pruner {config.fidelity.pruner}" if config.fidelity.pruner != "none" else "")]
    if config.fidelity.set:
        lines.append(f"  trials only (not the confirmation): {config.fidelity.describe_set()}")
    for n in search.named:
        if n.plan is None:
            continue
        values = search.budget_of(n.plan)
        where = "a trial" if n.in_space else n.note
        lines.append(f"  named {n.name}: {n.plan.describe()}; params {values['params']}, "
                     f"KV bytes/token {values['kv_bytes_per_token']}: {where}")
    c = config.confirm
    if c.enabled:
        lines.append(f"  then confirmed: top {c.top_k} and the named plans, {c.seeds} seeds"
                     + (f" x {c.steps} steps" if c.steps else "") + (", learning rates tuned" if c.nuisance else "")
                     + f"; claim: the search's best beats {c.baseline}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from headwise.errors import RunFailure
    from headwise.search import load_search
    from headwise.search.definition import builtin_searches

    if listed(args, "search", builtin_searches):
        return 0
    search = load_search(args.search, preset=args.preset, overrides=args.overrides, trials=args.trials)
    if args.dry_run:
        print(describe(search))
        return 0
    from headwise.report import study_report, write_report
    from headwise.search.runner import run_search

    if search.config.confirm.enabled and not args.no_confirm:
        study_report(search.config.confirm.report, f"{search.source} [confirm]")
    outcome = run_search(search, args.out, jobs=args.jobs, threads=args.threads, storage=args.storage,
                         worker=args.worker, new=args.new, confirm=not args.no_confirm, confirm_report=write_report,
                         backend=args.backend, address=args.address)
    timing = outcome.timing
    if timing.get("overhead") is not None:
        print(f"driver: {timing['driver_cpu_s']:.1f} s of CPU for {timing['trial_wall_s']:.0f} s of trials "
              f"({100 * timing['overhead']:.2f}%)")
    if not outcome.worker:
        from headwise.search.report import write_search_report

        print(f"report: {write_search_report(outcome.search_dir)}")
    if outcome.confirm_failure:
        raise RunFailure(f"the confirmation did not complete: {outcome.confirm_failure}")
    if outcome.failed:
        raise RunFailure(f"{len(outcome.failed)} trial(s) failed: {', '.join(map(str, outcome.failed[:5]))}; see "
                         f"{outcome.search_dir / 'logs'}; rerun the same command to run others in their place")
    return 0
