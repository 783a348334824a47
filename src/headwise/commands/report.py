"""``headwise report STUDY_DIR``: the study's report.md with figures (PNG) and their data (CSV)."""

from __future__ import annotations

import argparse

from headwise.config import finite_float

NAME = "report"


def _positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of heads")
    return value


HELP = "write a study's report (report.md, PNG figures and the CSV behind each) from its run directories"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", metavar="STUDY_DIR", help="a directory written by headwise study")
    p.add_argument("--at-heads", type=_positive_float, metavar="T",
                   help="total heads at which fitted curves are compared (default: the study's, else the "
                        "largest total every scheme reaches)")
    p.add_argument("--no-samples", action="store_true", help="skip text samples from the models")
    p.add_argument("--no-conditioning", action="store_true", help="skip the condition numbers of the final models")


def _check_at_heads(study_dir: str, at_heads: float) -> None:
    """Refuse --at-heads for a study whose report layout fits no curves over total heads (it
    would be ignored)."""
    from headwise.errors import HeadwiseError
    from headwise.report.options import study_report
    from headwise.report.registry import get_layout
    from headwise.study.layout import STUDY_TOML, load_study_record
    from headwise.tasks.union import parse_task_config

    record = load_study_record(study_dir)
    kind = study_report(record.definition.get("report"), str(record.path / STUDY_TOML)).kind
    if kind is None:
        try:
            kind = parse_task_config(dict(record.definition.get("base", {}).get("task", {}))).family.report_layout
        except HeadwiseError:
            return  # write_report says what is wrong with the study
    if "at_heads" not in get_layout(kind).Options.model_fields:
        raise HeadwiseError(f"--at-heads {at_heads:g}: the {kind!r} report of {study_dir} fits no curves over total "
                            "heads; leave --at-heads out (it applies to 'heads' reports)")


def run(args: argparse.Namespace) -> int:
    from headwise.errors import HeadwiseError
    from headwise.paths import unwritable
    from headwise.report import write_report
    from headwise.study.layout import REPORT_DIR, load_study_record

    if args.at_heads is not None:
        _check_at_heads(args.study_dir, args.at_heads)
    out = load_study_record(args.study_dir).path / REPORT_DIR
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"{out} is a file, where the study's report folder goes: move it away and run "
                            "`headwise report` again")
    blocked = unwritable(out)
    if blocked is not None:
        raise HeadwiseError(f"{blocked} is not writable, so the study's report cannot be written into {out}: make "
                            "it writable, or copy the study directory somewhere writable and report that")
    path = write_report(args.study_dir, at_heads=args.at_heads, samples=not args.no_samples,
                        conditioning=not args.no_conditioning)
    print(f"report: {path}")
    return 0
