"""``write_report``: a study directory's ``report/report.md``, its figures and their data.

It reads the study (``study.toml`` and the run directories) and writes only under ``report/``:
``results.csv`` belongs to the study runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from headwise.errors import HeadwiseError
from headwise.report import sections
from headwise.report.data import load_stage_runs, load_study_runs
from headwise.report.document import Document
from headwise.report.options import study_report
from headwise.report.probes import Probes
from headwise.report.registry import get_layout
from headwise.report.tuning import tuning_section
from headwise.report.verdicts import check_claims, verdict_section
from headwise.study.nuisance import read_choices
from headwise.study.layout import REPORT_DIR, STUDY_TOML, load_study_record

REPORT_FILE = "report.md"


def write_report(
    study_dir: str | Path,
    *,
    at_heads: float | None = None,
    samples: bool = True,
    conditioning: bool = True,
    echo: Callable[[str], None] = print,
) -> Path:
    """Write ``STUDY_DIR/report/report.md`` (and its figures); returns its path.

    ``at_heads`` overrides the total at which fitted curves are compared (layouts with fits);
    ``samples`` and ``conditioning`` switch off the sections that evaluate the final models."""
    record = load_study_record(study_dir)
    study = load_study_runs(record)
    spec = study_report(record.definition.get("report"), str(record.path / STUDY_TOML))
    if spec.kind is None:
        task = study.task
        if task is None:
            raise HeadwiseError(f"{record.path}: the study's task config cannot be read to choose its report layout; "
                                "name one with [report] kind")
        spec = spec.with_kind(task.family.report_layout)
    # everything that can refuse the report is read before its folder is touched
    claims, nuisance = record.claims, record.nuisance  # each parses study.toml's table
    stages = load_stage_runs(record) if claims else {}
    check_claims(study, claims, stages, str(record.path / STUDY_TOML))
    choices = read_choices(record.path) if nuisance is not None else []
    out = record.path / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    options = spec.options
    # only layouts that compare fitted curves at a total have at_heads to override
    if at_heads is not None and "at_heads" in type(options).model_fields:
        options = options.model_copy(update={"at_heads": at_heads})
    probes = Probes(out)
    layout = get_layout(spec.kind)(study, options, probes, echo)
    doc = Document(out)
    sections.header(doc, study)
    findings_at = doc.mark()
    findings: list[str] = []
    if study.done:
        findings = layout.sections(doc)
        if claims:
            findings += verdict_section(doc, study, claims, stages)
        if nuisance is not None:
            findings += tuning_section(doc, nuisance, choices)
    else:
        doc.add("No run has completed yet: rerun the study to finish them, then `headwise report` again.")
    sections.results_table(doc, study)
    if study.done:
        sections.time_section(doc, study, layout)
        sections.curves_section(doc, study, layout)
        if layout.conditioning:
            if conditioning:
                echo("report: conditioning of the final models")
            sections.conditioning_section(doc, study, layout, probes, conditioning)
        if samples:
            sections.samples_section(doc, study, spec, probes, echo)
    sections.reproduce(doc, study)
    if findings:
        doc.insert(findings_at, ["## Findings", "", *[f"- {f}" for f in findings], ""])
    return doc.write(REPORT_FILE)
