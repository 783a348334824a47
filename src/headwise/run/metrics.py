"""Reading a run's ``metrics.jsonl`` (written by :class:`headwise.train.metrics.MetricsLog`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.run.layout import RunDir


def scan_metrics(run_dir: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a run's ``metrics.jsonl`` and how many damaged lines were skipped (bytes that
    are not UTF-8 or not JSON, JSON that is not an object with an integer ``step``). A torn last
    line, left by a kill mid-write, is skipped too but not counted: it is no damage."""
    path = RunDir(run_dir).metrics
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        return [], 1
    rows, bad = [], 0
    lines = data.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
        elif not (i == len(lines) - 1 and not data.endswith(b"\n")):
            bad += 1
    return rows, bad


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``; a torn or damaged line is skipped (see
    :func:`scan_metrics`)."""
    return scan_metrics(run_dir)[0]
