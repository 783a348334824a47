"""The verdicts check: does a verdict study, rerun from this checkout, reproduce its record?

    python3 benchmarks/check_verdicts.py check rank                # rerun the cheapest (~10 min on 2 cores)
    python3 benchmarks/check_verdicts.py check lra --out DIR       # any verdict study; DIR resumes
    python3 benchmarks/check_verdicts.py compare STUDY_DIR         # a finished study (or search), no run
    python3 benchmarks/check_verdicts.py record STUDY_DIR [...]    # write its rows into docs/verdicts.json
                                                                   # (or a search folder: its confirm/)

``docs/verdicts.json`` holds each verdict study's rows as the run behind the README's verdict table
gave them (with the command, seeds, thread count, torch version, CPU and date). ``check`` runs
``headwise study NAME --preset PRESET`` (the recorded preset, ``verdict``) into a fresh directory
(``studies_out/check-NAME-PRESET`` by default) and compares: every recorded comparison must get the
same verdict, and each run's mean gain must lie inside the other's interval
(:mod:`headwise.report.verdict_record`). A run of another preset or seed count than the record's is
neither compared with it nor recorded over it (``record --replace`` replaces a record on purpose).
Exits 0 when everything is reproduced, 1 when something is not, 2 on bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError, OneLineParser, guarded
from headwise.report.verdict_record import disagreements, rows_of, study_entry, verdict_rows
from headwise.search.layout import load_saved
from headwise.search.record import CONFIRM_DIR
from headwise.study.layout import load_study_record
from headwise.train.peak import cpu_model

RECORD = Path(__file__).resolve().parents[1] / "docs" / "verdicts.json"


@dataclass(frozen=True)
class Run:
    """A finished verdict study as the record keeps it: the folder given, the study's own folder,
    its name, the command that ran it, its preset and its seeds."""

    given: Path
    study_dir: Path
    name: str
    command: str
    preset: str
    seeds: int

    def describe(self) -> str:
        return _describe(self.preset, self.seeds)


def _describe(preset: Any, seeds: Any) -> str:
    return f"preset {preset or '(none)'} with {seeds} seeds"


def read_record(path: Path) -> dict[str, dict[str, Any]]:
    """The record ({} when there is none); a damaged one is bad input that says how to restore it."""
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
        for name, entry in record.items():  # every entry must be usable before anything reads or rewrites one
            rows_of(entry)
            if not {"preset", "seeds", "command", "date", "cpu"} <= set(entry):
                raise ValueError(f"the record of {name} lacks its preset, seeds, command, date or cpu")
    except (ValueError, AttributeError, TypeError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HeadwiseError(f"{path} is damaged ({why}); restore it with `git checkout docs/{path.name}`") from None
    return record


def recorded_entry(record: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """The record of study ``name``; a study with none is bad input."""
    if name not in record:
        raise HeadwiseError(f"{RECORD.name} has no record of study {name!r} "
                            f"(recorded: {', '.join(sorted(record)) or 'none'})")
    return record[name]


def recorded_study(path: Path) -> Run:
    """The verdict study in ``path``: a study directory, or a search folder (or its ``confirm/``),
    whose confirmation is the verdict study ``headwise search`` ran (with the search's preset)."""
    if not path.is_dir():
        raise HeadwiseError(f"{path} is not a folder: give a finished study folder or search folder")
    saved = load_saved(path)
    resolved = path.resolve()
    if not saved and resolved.name == CONFIRM_DIR and load_saved(resolved.parent):
        return recorded_study(resolved.parent)  # a search's confirmation: record it as the search
    if not saved:
        study = load_study_record(path)
        return Run(path, path, study.name, f"headwise study {study.name} --preset {study.preset}", study.preset,
                   study.seeds)
    if not (path / CONFIRM_DIR).is_dir():
        raise HeadwiseError(f"{path} is a search folder with no confirmation ({CONFIRM_DIR}/): nothing to record")
    preset = saved.get("preset") or ""
    study = load_study_record(path / CONFIRM_DIR)
    command = f"headwise search {saved['name']}" + (f" --preset {preset}" if preset else "")
    return Run(path, path / CONFIRM_DIR, study.name, command, preset, study.seeds)


def refuse_another_run(run: Run, entry: dict[str, Any], what: str) -> None:
    """Bad input when ``run`` is not of the recorded study's preset and seeds: its verdicts are
    neither the record's to hold against nor to replace it with."""
    if (run.preset, run.seeds) != (entry["preset"], entry["seeds"]):
        raise HeadwiseError(f"{run.given} ran study {run.name} at {run.describe()}, but {RECORD.name} records it at "
                            f"{_describe(entry['preset'], entry['seeds'])} (`{entry['command']}`): {what}")


def compare(run: Run, record: dict[str, dict[str, Any]]) -> int:
    """Print the rerun's rows and every recorded comparison it does not reproduce: 0 when none, 1 otherwise."""
    entry = recorded_entry(record, run.name)
    refuse_another_run(run, entry, "compare a run of that command")
    rerun = verdict_rows(run.study_dir)
    for row in rerun:
        print(f"{row.variant} vs {row.baseline}: {row.mean:.4g} [{row.low:.4g}, {row.high:.4g}] -> {row.verdict}")
    problems = disagreements(rows_of(entry), rerun)
    for line in problems:
        print(f"NOT REPRODUCED {line}")
    if not problems:
        print(f"{run.name}: every recorded verdict reproduced (recorded {entry['date']} on {entry['cpu']})")
    return 1 if problems else 0


def record_runs(paths: list[Path], record: dict[str, dict[str, Any]], replace: bool) -> None:
    """Write the rows of the studies in ``paths`` into the record, once all of them are checked: a
    study's record is replaced only by a run of its preset and seeds with comparisons, or on purpose."""
    entries: dict[str, dict[str, Any]] = {}
    for path in paths:
        run = recorded_study(path)
        if run.name in entries:
            raise HeadwiseError(f"{path} is a second run of study {run.name}: record one")
        entry = {**study_entry(run.study_dir, run.command, cpu_model()), "preset": run.preset}
        old = record.get(run.name)
        if old is not None and not replace:
            refuse_another_run(run, old, "rerun it as the record says, or pass --replace to replace the record")
            if old["rows"] and not entry["rows"]:
                raise HeadwiseError(f"{path} has no comparisons of study {run.name}, whose record holds "
                                    f"{len(old['rows'])}: finish its runs, or pass --replace to replace the record")
        entries[run.name] = entry
    for name, entry in entries.items():
        print(f"recorded {name}: {len(entry['rows'])} comparisons")
    atomic_write_text(RECORD, json.dumps({**record, **entries}, indent=1, sort_keys=True) + "\n")


@guarded("check_verdicts")
def main(argv: list[str] | None = None) -> int:
    """Run ``check``, ``compare`` or ``record`` (see the module's docstring); the exit status."""
    p = OneLineParser(prog="check_verdicts.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True, parser_class=OneLineParser)
    c = sub.add_parser("check", help="rerun a verdict study and compare it with the record")
    c.add_argument("study", help="a built-in study with a verdict preset (rank is the cheapest)")
    c.add_argument("--out", type=Path, help="the rerun's directory (default studies_out/check-NAME-PRESET)")
    c.add_argument("--jobs", type=int, default=2)
    sub.add_parser("compare", help="compare a finished study directory with the record").add_argument(
        "study_dir", type=Path)
    r = sub.add_parser("record", help="write finished verdict studies' rows into docs/verdicts.json")
    r.add_argument("study_dirs", type=Path, nargs="+")
    r.add_argument("--replace", action="store_true",
                   help="replace a study's record even with a run of another preset or seeds, or with no comparisons")
    args = p.parse_args(argv)
    record = read_record(RECORD)
    if args.what == "record":
        record_runs(args.study_dirs, record, args.replace)
        return 0
    if args.what == "compare":
        return compare(recorded_study(args.study_dir), record)
    entry = recorded_entry(record, args.study)
    if entry["command"].startswith("headwise search"):  # a search picks its plans anew: rerun it whole, then compare
        raise HeadwiseError(f"{args.study} was recorded from a search: run `{entry['command']} --out DIR`, "
                            "then `compare DIR`")
    out = args.out or Path("studies_out") / f"check-{args.study}-{entry['preset']}"
    rc = subprocess.call([sys.executable, "-m", "headwise", "study", args.study, "--preset", entry["preset"],
                          "--out", str(out), "--jobs", str(args.jobs), "--no-report"])
    if rc != 0:  # the study said why on its own line (and where its logs are, when it has any)
        return rc if rc > 0 else 128 - rc
    return compare(recorded_study(out), record)


if __name__ == "__main__":
    sys.exit(main())
