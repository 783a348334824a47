"""Reading a run's ``metrics.jsonl`` (written by :class:`headwise.train.metrics.MetricsLog`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.run.layout import RunDir


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (a torn last line, from a kill mid-write, is skipped)."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
