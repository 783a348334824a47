"""Where a study keeps things, and its saved definition (``study.toml``).

    STUDY_DIR/
      study.toml                   the resolved study (definition after the preset, seeds, variants)
      results.csv                  one row per run, rewritten as runs finish
      configs/VARIANT-seedK.toml   the input config of each run
      runs/VARIANT/seedK/          each run's directory (written by ``headwise train``)
      logs/VARIANT-seedK.log       each run's output
      report/report.md             the report, its figures (PNG) and their data (CSV)
      tuning/                      the [nuisance] tuning runs (headwise.study.nuisance)
      stages/NAME/                 each [[stages]] entry's runs, laid out as above (headwise.study.stages)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from headwise.config import atomic_write_text, read_toml
from headwise.errors import HeadwiseError
from headwise.study.claims import Claim
from headwise.study.nuisance import Nuisance
from headwise.study.definition import Study

STUDY_TOML = "study.toml"
RESULTS_CSV = "results.csv"
REPORT_DIR = "report"


def run_dir(study_dir: Path, variant: str, seed: int) -> Path:
    return Path(study_dir) / "runs" / variant / f"seed{seed}"


def job_paths(root: Path, run: Path, name: str) -> dict[str, Path]:
    """A run's directory ``run`` with its input config, log and lock, named ``name`` under ``root``
    (a :class:`~headwise.study.jobs.RunJob`'s paths, by its field names)."""
    return {"run_dir": run, "config_path": Path(root) / "configs" / f"{name}.toml",
            "log_path": Path(root) / "logs" / f"{name}.log", "lock_path": Path(root) / "locks" / f"{name}.lock"}


def run_paths(study_dir: Path, variant: str, seed: int) -> dict[str, Path]:
    """Everything of one run of a study: its directory, input config, log and lock."""
    return job_paths(study_dir, run_dir(study_dir, variant, seed), f"{variant}-seed{seed}")


@dataclass
class StudyRecord:
    """A study as saved in its directory: enough to list its runs and lay out its report."""

    path: Path
    name: str
    preset: str
    preset_summary: str
    source: str
    seeds: int
    fingerprint: str
    definition: dict[str, Any]
    variants: list[dict[str, Any]]
    #: what the runs' numbers depend on beyond their configs: torch threads per run, torch's
    #: version (empty for studies saved before it was kept)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def claims(self) -> list[Claim]:
        """The claims the study declared before its runs (``[[claims]]``)."""
        where = str(self.path / STUDY_TOML)
        return [Claim.parse(c, source=where) for c in self.definition.get("claims", [])]

    @property
    def nuisance(self) -> Nuisance | None:
        """The settings the study tuned per variant (``[nuisance]``), if any."""
        table = self.definition.get("nuisance")
        return None if table is None else Nuisance.parse(table, source=str(self.path / STUDY_TOML))

    @property
    def description(self) -> str:
        return str(self.definition.get("description", ""))

    def runs(self) -> list[tuple[dict[str, Any], int]]:
        """(variant entry, seed) for every run, in definition order."""
        return [(v, s) for v in self.variants for s in range(self.seeds)]


def save_study(study: Study, study_dir: Path, seeds: int, environment: dict[str, Any] | None = None) -> None:
    """Write ``study.toml`` (atomically) recording ``seeds`` seeds per variant and the
    ``environment`` its runs ran in (see :func:`headwise.study.runner.check_environment`)."""
    data = study.to_dict()
    data["seeds"] = seeds
    if environment:
        data["environment"] = environment
    atomic_write_text(Path(study_dir) / STUDY_TOML, tomli_w.dumps(data))


def load_study_record(study_dir: str | Path) -> StudyRecord:
    """Read a study directory's ``study.toml``; a directory without one is a HeadwiseError."""
    path = Path(study_dir)
    if not (path / STUDY_TOML).is_file():
        raise HeadwiseError(f"{path} is not a study directory (no {STUDY_TOML}); run `headwise study` first")
    data = read_toml(path / STUDY_TOML)
    try:
        return StudyRecord(
            path=path,
            name=str(data["name"]),
            preset=str(data.get("preset", "")),
            preset_summary=str(data.get("preset_summary", "")),
            source=str(data.get("source", "")),
            seeds=int(data["seeds"]),
            fingerprint=str(data["fingerprint"]),
            definition=dict(data["definition"]),
            variants=list(data["variants"]),
            environment=dict(data.get("environment", {})),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HeadwiseError(f"{path / STUDY_TOML} is damaged ({exc!r} missing or wrong); rerun the study") from None
