"""What one training run leaves on disk: its directory layout, its typed summary and its tokenizer.

This is the contract between the trainer (which writes a run) and everything downstream (study
results, reports, analysis, generation), which read it only through these modules
(the tokenizer's: :mod:`headwise.run.tokenizer`).
"""

from headwise.run.layout import RunDir
from headwise.run.metrics import read_metrics
from headwise.run.summary import RunStatus, RunSummary, read_summary, write_summary

__all__ = ["RunDir", "RunStatus", "RunSummary", "read_metrics", "read_summary", "write_summary"]
