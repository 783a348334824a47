"""The verdicts check: does a verdict study, rerun from this checkout, reproduce its record?

    python3 benchmarks/check_verdicts.py check rank                # rerun the cheapest (~10 min on 2 cores)
    python3 benchmarks/check_verdicts.py check lra --out DIR       # any verdict study; DIR resumes
    python3 benchmarks/check_verdicts.py compare STUDY_DIR         # a finished study (or search), no run
    python3 benchmarks/check_verdicts.py record STUDY_DIR [...]    # write its rows into docs/verdicts.json
                                                                   # (or a search folder: its confirm/)

``docs/verdicts.json`` holds each verdict study's rows as the run behind the README's verdict table
gave them (with the command, seeds, thread count, torch version, CPU and date). ``check`` runs
``headwise study NAME --preset verdict`` into a fresh directory (``studies_out/check-NAME-verdict``
by default) and compares: every recorded comparison must get the same verdict, and each run's mean
gain must lie inside the other's interval (:mod:`headwise.report.verdict_record`). Exits 0 when
everything is reproduced, 1 when something is not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from headwise.config import atomic_write_text
from headwise.report.verdict_record import disagreements, rows_of, study_entry, verdict_rows
from headwise.search.layout import CONFIRM_DIR, load_saved
from headwise.study.layout import load_study_record
from headwise.train.peak import cpu_model

RECORD = Path(__file__).resolve().parents[1] / "docs" / "verdicts.json"


def read_record(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def compare(study_dir: Path, record: dict) -> int:
    name = load_study_record(study_dir).name
    if name not in record:
        print(f"{RECORD.name} has no record of study {name!r} (recorded: {', '.join(sorted(record)) or 'none'})",
              file=sys.stderr)
        return 2
    rerun = verdict_rows(study_dir)
    for row in rerun:
        print(f"{row.variant} vs {row.baseline}: {row.mean:.4g} [{row.low:.4g}, {row.high:.4g}] -> {row.verdict}")
    problems = disagreements(rows_of(record[name]), rerun)
    for line in problems:
        print(f"NOT REPRODUCED {line}")
    if not problems:
        print(f"{name}: every recorded verdict reproduced (recorded {record[name]['date']} on {record[name]['cpu']})")
    return 1 if problems else 0


def recorded_study(path: Path) -> tuple[Path, str, str]:
    """The verdict study in ``path``, the command that ran it and its preset: a study directory,
    or a search folder, whose confirmation (``confirm/``) is the verdict study ``headwise search``
    ran (the search's preset)."""
    saved = load_saved(path)
    if not saved:
        study = load_study_record(path)
        return path, f"headwise study {study.name} --preset {study.preset}", study.preset
    if not (path / CONFIRM_DIR).is_dir():
        raise SystemExit(f"{path} is a search folder with no confirmation ({CONFIRM_DIR}/): nothing to record")
    preset = saved.get("preset") or ""
    return path / CONFIRM_DIR, f"headwise search {saved['name']}" + (f" --preset {preset}" if preset else ""), preset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("check", help="rerun a verdict study and compare it with the record")
    c.add_argument("study", help="a built-in study with a verdict preset (rank is the cheapest)")
    c.add_argument("--out", type=Path, help="the rerun's directory (default studies_out/check-NAME-verdict)")
    c.add_argument("--jobs", type=int, default=2)
    sub.add_parser("compare", help="compare a finished study directory with the record").add_argument(
        "study_dir", type=Path)
    r = sub.add_parser("record", help="write finished verdict studies' rows into docs/verdicts.json")
    r.add_argument("study_dirs", type=Path, nargs="+")
    args = p.parse_args(argv)
    record = read_record(RECORD)
    if args.what == "record":
        for d in args.study_dirs:
            d, command, preset = recorded_study(d)
            saved = load_study_record(d)
            record[saved.name] = {**study_entry(d, command, cpu_model()), "preset": preset}
            print(f"recorded {saved.name}: {len(record[saved.name]['rows'])} comparisons")
        atomic_write_text(RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
        return 0
    if args.what == "compare":
        return compare(recorded_study(args.study_dir)[0], record)
    command = record.get(args.study, {}).get("command", "")
    if command.startswith("headwise search"):  # a search picks its plans anew: rerun it whole, then compare
        print(f"{args.study} was recorded from a search: run `{command} --out DIR`, then `compare DIR`",
              file=sys.stderr)
        return 2
    out = args.out or Path("studies_out") / f"check-{args.study}-verdict"
    rc = subprocess.call([sys.executable, "-m", "headwise", "study", args.study, "--preset", "verdict",
                          "--out", str(out), "--jobs", str(args.jobs), "--no-report"])
    if rc != 0:
        print(f"the study exited {rc}; see {out / 'logs'}", file=sys.stderr)
        return 1 if rc == 1 else rc
    return compare(out, record)


if __name__ == "__main__":
    sys.exit(main())
