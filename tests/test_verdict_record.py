"""The verdict record (docs/verdicts.json) behind the README's verdict table, and the rule by which
a rerun reproduces it (headwise.report.verdict_record)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from headwise.report.document import fmt
from headwise.report.verdict_record import VerdictRow, disagreements, rows_of

ROOT = Path(__file__).resolve().parents[1]


def row(mean=0.5, low=0.3, high=0.7, verdict="superior", variant="v") -> VerdictRow:
    return VerdictRow("c", variant, "b", "better", "error", 5, mean, low, high, 0.95, 1.0, verdict, "")


def test_a_rerun_within_each_other_s_interval_with_the_same_verdict_reproduces():
    assert disagreements([row()], [row(mean=0.6, low=0.45, high=0.75)]) == []


@pytest.mark.parametrize("rerun, problem", [
    (row(mean=0.72, low=0.45, high=0.99), "the rerun's mean 0.72 lies outside the recorded interval [0.3, 0.7]"),
    (row(mean=0.65, low=0.62, high=0.68), "the recorded mean 0.5 lies outside the rerun's interval [0.62, 0.68]"),
    (row(mean=0.5, low=-0.1, high=1.1, verdict="not shown at this scale"),
     "verdict 'not shown at this scale', recorded 'superior'"),
    (row(variant="other"), "not in the rerun"),
])
def test_a_rerun_that_moves_is_named(rerun, problem):
    found = disagreements([row()], [rerun])
    assert len(found) == 1 and problem in found[0] and found[0].startswith("'c': v vs b")


def test_the_readme_quotes_the_recorded_verdicts():
    """Every recorded comparison's gain, interval and verdict are on one row of the README's table."""
    record = json.loads((ROOT / "docs" / "verdicts.json").read_text())
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme[readme.index("## Verdicts on the papers' claims"):].splitlines()
             if line.startswith("| [")]
    for study, entry in record.items():
        for r in rows_of(entry):
            interval = f"{fmt(r.mean)} [{fmt(r.low)}, {fmt(r.high)}]"
            lines = [line for line in table if interval in line]
            assert len(lines) == 1, f"{study}: the README has no row (or several) with {interval}"
            assert r.verdict in lines[0], f"{study}: the README's row with {interval} does not say {r.verdict!r}"
            assert re.search(rf"\), {r.n} \|", lines[0]), f"{study}: the README's row with {interval} does not say n {r.n}"
