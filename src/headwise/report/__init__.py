"""Study reports: ``report.md`` with PNG figures and the CSV behind each.

    from headwise.report import write_report
    write_report("studies_out/progression-tiny")

- :mod:`~headwise.report.build`: :func:`write_report`, which puts the sections below together;
- :mod:`~headwise.report.options`: :class:`ReportSpec`, the ``[report]`` table, which the study
  keeps as written and :func:`study_report` checks (the study does not import the report);
- :mod:`~headwise.report.registry`: one layout per study kind, chosen by the study's ``[report]
  kind`` and found in the families' folders: ``heads`` and ``depth`` in the lm family's
  ``report_heads.py`` and ``report_depth.py``; ``rank`` (nearest), ``vision``, ``lra`` and
  ``encoder`` in their family's ``report.py``;
- :mod:`~headwise.report.data`: the study's runs, typed (:class:`~headwise.run.RunSummary`, plans);
- :mod:`~headwise.report.document`: markdown, figures and their CSV, written atomically;
- :mod:`~headwise.report.stats`: fits, seed statistics and tests;
- :mod:`~headwise.report.probes`: conditioning, samples and scores of the final models, cached;
- :mod:`~headwise.report.sections`: the sections every report has, and the tables and cells of
  the layouts that compare variants against a baseline;
- :mod:`~headwise.report.accuracy`: what the classification layouts share;
- :mod:`~headwise.report.paper`: the published table a layout quotes, and its ``[report]`` keys;
- :mod:`~headwise.report.paired`, :mod:`~headwise.report.verdicts`: the study's ``[[claims]]``
  tested on paired seeds; :mod:`~headwise.report.verdict_record`: the verdicts as a record, and
  whether a rerun reproduces them;
- :mod:`~headwise.report.tuning`: the tuning section.

Importing the package is light (``headwise study`` checks a study's ``[report]`` table through it
before the runs start); matplotlib loads only when a figure is drawn.
"""

from __future__ import annotations


from headwise.lazy import lazy_exports
from headwise.report.options import ReportSpec, study_report

__all__ = ["ReportSpec", "study_report", "write_report"]

# write_report on first use: it pulls in matplotlib, scipy and the models
__getattr__ = lazy_exports(__name__, {"write_report": "headwise.report.build"})
