"""``headwise study``: run a whole study (built-in by name, or a study file), resumably, then report.

    headwise study progression --preset quick
    headwise study rank --preset tiny --jobs 2 --out studies_out/rank
    headwise study my-study.toml --seeds 3 --backend ray --address auto
    headwise study --list

Before any run starts and before the study directory is made, the study's ``[report]`` table is
checked by the report (:func:`headwise.report.study_report`) and the study checks what its runs
share (see :mod:`headwise.study.preflight`): its data is prepared (tokenized into the token cache),
CUDA runs need a CUDA device, ``--out`` must be usable. A study that fails a check is refused
with one line (exit 2) and leaves nothing behind. ``--dry-run`` checks only the variants' specs,
and loads nothing of the report, the runner or torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from headwise.errors import HeadwiseError

NAME = "study"
HELP = "run a study (many runs from one definition), resumably, locally or on Ray, and write its report"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", nargs="?", metavar="NAME|FILE", help="a built-in study (see --list) or a study .toml file")
    p.add_argument("--preset", help="the study's preset (built-in studies: paper, tiny, quick; default tiny)")
    p.add_argument("--seeds", type=int, help="seeds per variant (default: the study's, or the number already run)")
    p.add_argument("--out", metavar="DIR", help="study directory (default studies_out/NAME-PRESET)")
    p.add_argument("--jobs", type=int, help="runs at a time (default: the study's, else 1 locally and as resources "
                   "allow on Ray)")
    add_backend_options(p, "run", "study")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base run config, e.g. --set train.device=cuda (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="list the variants and their settings, run nothing (prepares no data)")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--list", action="store_true", help="list the built-in studies and their presets")


def add_backend_options(p: argparse.ArgumentParser, unit: str, kind: str) -> None:
    """``--threads``, ``--backend``, ``--address``: where a study's runs or a search's trials run."""
    p.add_argument("--threads", type=int, help=f"torch threads per {unit} (default: the {kind}'s, else the cores "
                   f"divided among the jobs); with Ray, the CPUs each {unit} requests (default 1)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help=f"local: subprocesses on this machine; ray: one Ray task per {unit} (a GPU each on CUDA)")
    p.add_argument("--address", help="join this Ray cluster (e.g. auto or ray://host:10001) with --backend ray")


def listed(args: argparse.Namespace, kind: str, builtins: Callable[[], dict]) -> bool:
    """With ``--list``, print the built-in ``kind``s (studies, searches) and their presets and say
    so; without it, refuse a missing NAME|FILE."""
    from headwise.study.definition_file import builtin_listing

    if args.list:
        print("\n".join(builtin_listing(builtins())))
        return True
    if not getattr(args, kind):
        raise HeadwiseError(f"name a {kind} (e.g. `headwise {kind} progression --preset quick`) or pass --list")
    return False


def describe(study) -> str:  # noqa: ANN001 - a headwise.study.definition.Study
    """What ``--dry-run`` prints: each variant's heads per layer (as its plan resolves them, with
    any note on the budget) and the keys it sets, then the stages and the tuning."""
    lines = [f"study {study.name}" + (f" (preset {study.preset})" if study.preset else "")
             + f": {len(study.variants)} variants x {study.seeds} seeds"]
    width = max(len(v.name) for v in study.variants)
    for v in study.variants:
        sets = ", ".join(f"{k}={v2}" for k, v2 in v.sets.items())
        heads = ("" if v.plan is None
                 else f"heads {','.join(map(str, v.plan.heads))} (total {v.plan.total}, {v.plan.scheme})")
        lines.append(f"  {v.name:<{width}}  {heads:<40} {sets}")
        lines += [f"  {'':<{width}}  note: {note}" for note in (v.plan.notes if v.plan else ())]
    for stage in study.config.stages:
        task, prune = stage.config.get("task", {}), stage.config.get("train", {}).get("prune")
        what = f"{task.get('kind', 'the run')} {task.get('task', '')}".strip()
        what += f"'s heads pruned to {prune['to']} ({prune.get('scope', 'global')}), then trained" if prune else ""
        of = f" of {', '.join(stage.variants)}" if stage.variants else ""
        lines.append(f"then stage {stage.name} from each run{of} ({what}; {', '.join(stage.source_keys)} = the run's folder)")
    nuisance = study.config.nuisance
    if nuisance is not None:
        grid = "; ".join(f"{k} in {', '.join(f'{x:g}' for x in vals)}" for k, vals in nuisance.values.items())
        chosen = ", ".join(f"{k}={x}" for k, x in nuisance.selection.items())
        seeds = ", ".join(map(str, nuisance.seeds))
        lines.append(f"tuned per variant on seeds {seeds} (their mean) before its seeds run: {grid} (selected on {chosen}, "
                     f"{nuisance.metric}, {nuisance.better} is better; up to {nuisance.extend} extensions at an edge)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from headwise.study import load_study
    from headwise.study.definition import builtin_studies

    if listed(args, "study", builtin_studies):
        return 0
    study = load_study(args.study, preset=args.preset, seeds=args.seeds, overrides=args.overrides)
    if args.dry_run:
        print(describe(study))  # the variants alone: nothing of the report or the runner (torch) loads
        return 0
    # imported past the dry run, which lists variants only; the report refuses a bad [report]
    # table before any run starts
    from headwise.report import study_report, write_report
    from headwise.study.runner import run_study

    study_report(study.config.report, study.source)
    run_study(study, args.out, jobs=args.jobs, threads=args.threads, backend=args.backend, address=args.address,
              seeds_given=args.seeds is not None, report=None if args.no_report else write_report)
    return 0
