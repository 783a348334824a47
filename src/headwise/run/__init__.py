"""What one training run leaves on disk: its directory layout, its typed summary, its metrics log
and its tokenizer.

This is the contract between the trainer (which writes a run) and everything downstream (study
results, reports, analysis, generation), which read it only through these modules:
:mod:`~headwise.run.layout` (the files of a run directory), :mod:`~headwise.run.summary`
(``summary.json``), :mod:`~headwise.run.metrics` (``metrics.jsonl``) and
:mod:`~headwise.run.tokenizer` (the saved tokenizer).
"""

from headwise.run.layout import RunDir
from headwise.run.metrics import read_metrics
from headwise.run.summary import RunStatus, RunSummary, read_summary, write_summary

__all__ = ["RunDir", "RunStatus", "RunSummary", "read_metrics", "read_summary", "write_summary"]
