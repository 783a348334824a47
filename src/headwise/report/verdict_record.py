"""A study's verdicts as a record (``docs/verdicts.json``), and whether a rerun reproduces them.

The README's verdict table quotes the record, and ``benchmarks/check_verdicts.py`` reruns a
verdict study from a clean checkout and holds its verdicts against the record. A rerun
*reproduces* a recorded comparison when both name the same verdict and each one's mean gain lies
inside the other's interval (the claim's Bonferroni-adjusted one): two honest runs of the same
study on other machines differ by seed-level noise, which the intervals carry, but not by more.
"""

from __future__ import annotations

import math
import platform
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

from headwise.report.verdicts import study_comparisons
from headwise.study.layout import load_study_record


@dataclass(frozen=True)
class VerdictRow:
    """One comparison of a claim, as recorded."""

    claim: str
    variant: str
    baseline: str
    test: str
    metric: str
    n: int
    mean: float
    low: float
    high: float
    #: the interval's two-sided confidence (1 - 5% / m)
    confidence: float
    baseline_mean: float
    verdict: str
    note: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.claim, self.variant, self.baseline


def verdict_rows(study_dir: str | Path) -> list[VerdictRow]:
    """Every comparison of every claim of a finished study, judged as its report judges it."""
    return [VerdictRow(c.claim.name, c.variant.name, c.baseline.name, c.claim.test, c.claim.label, c.judged.gain.n,
                       c.judged.gain.mean, c.judged.low, c.judged.high, c.judged.confidence, c.baseline_mean,
                       str(c.judged.verdict), c.judged.note) for c in study_comparisons(study_dir)]


def study_entry(study_dir: str | Path, command: str, cpu: str | None = None) -> dict[str, Any]:
    """What the record keeps of one study: the command that ran it, where and with what, and its rows."""
    record = load_study_record(study_dir)
    return {"study": record.name, "preset": record.preset, "command": command, "seeds": record.seeds,
            "environment": record.environment, "cpu": cpu or platform.processor() or platform.machine(),
            "date": date.today().isoformat(), "rows": [asdict(r) for r in verdict_rows(study_dir)]}


def rows_of(entry: dict[str, Any]) -> list[VerdictRow]:
    """The rows of a recorded study entry."""
    return [VerdictRow(**r) for r in entry["rows"]]


def disagreements(recorded: list[VerdictRow], rerun: list[VerdictRow]) -> list[str]:
    """One line per recorded comparison the rerun does not reproduce (see the module's rule);
    none when every one is reproduced."""
    found = {r.key: r for r in rerun}
    out = []
    for old in recorded:
        new = found.get(old.key)
        what = f"{old.claim!r}: {old.variant} vs {old.baseline}"
        if new is None:
            out.append(f"{what}: not in the rerun")
            continue
        if new.verdict != old.verdict:
            out.append(f"{what}: verdict {new.verdict!r}, recorded {old.verdict!r}")
        if not _inside(new.mean, old):
            out.append(f"{what}: the rerun's mean {new.mean:.4g} lies outside the recorded interval "
                       f"[{old.low:.4g}, {old.high:.4g}]")
        if not _inside(old.mean, new):
            out.append(f"{what}: the recorded mean {old.mean:.4g} lies outside the rerun's interval "
                       f"[{new.low:.4g}, {new.high:.4g}]")
    return out


def _inside(x: float, row: VerdictRow) -> bool:
    return all(math.isfinite(v) for v in (x, row.low, row.high)) and row.low <= x <= row.high
