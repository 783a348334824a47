"""What a search folder holds, as its report reads it: the file names, ``trials.json``'s trials and
objectives, and the saved ``search.toml`` (read once). Light on purpose (no torch, no Optuna), so
the report, its figures and the layout share it without importing the search machinery.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.plans import Plan, Scheme
from headwise.study.definition_file import Objective

SEARCH_TOML, TRIALS_JSON, CONFIRM_DIR, OPTUNA_DB = "search.toml", "trials.json", "confirm", "optuna.db"
#: the Optuna study's name in its storage
STUDY_NAME = "headwise-search"


def oriented(value: float, direction: str) -> float:
    """``value`` turned so that lower is better."""
    return value if direction == "minimize" else -value


@dataclass(frozen=True)
class Trial:
    """One trial of ``trials.json``."""

    number: int
    state: str
    #: its plan's layers: heads, and head widths, KV heads and MLP widths where the trial records
    #: them (two trials of one plan have equal plans)
    plan: Plan
    #: what the plan costs: {"params", "flops_per_token", "kv_bytes_per_token", "total_heads"}
    budget: dict[str, float] = field(default_factory=dict)
    #: objective metric -> value (a pruned trial's last reported one)
    values: dict[str, float] = field(default_factory=dict)
    #: the named plan's name for its trial ("constant", "l6-h4-m4", ...)
    named: str | None = None
    #: its learning rate, where the search draws it (None: the base's)
    lr: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        """A trial of ``trials.json`` (the fields this report reads; Optuna's params are in its store)."""
        plan = Plan.of(Scheme.EXPLICIT, *(d.get(k) or () for k in ("heads", "head_dims", "kv_heads", "mlp_hidden")))
        return cls(int(d["number"]), str(d["state"]), plan, dict(d.get("budget") or {}), dict(d.get("values") or {}),
                   d.get("named"), d.get("lr"))

    def value(self, metric: str) -> float | None:
        """The trial's finite value of ``metric`` (None when it has none)."""
        v = self.values.get(metric)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    def score(self, o: Objective) -> float:
        """The trial's value of ``o`` turned so that lower is better (inf when it has none)."""
        v = self.value(o.metric)
        return math.inf if v is None else oriented(v, o.direction)


@dataclass(frozen=True)
class SearchRecord:
    """A search folder as its report reads it: ``trials.json`` and the saved ``search.toml``."""

    name: str
    preset: str
    objectives: list[Objective]
    #: {"metric", "max", "min", "target"}; {} without a budget
    budget: dict[str, Any]
    trials: list[Trial]
    #: the named plans: [{"name", "heads", "in_space", "note"}] (one outside the space runs no trial)
    named: list[dict[str, Any]] = field(default_factory=list)
    #: the saved ``search.toml`` ({} when there is none or it cannot be read), read once for the report
    saved: dict[str, Any] = field(default_factory=dict)
    #: why ``search.toml`` could not be read (None when it could, or there is none)
    saved_problem: str | None = None


def read_saved(search_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The saved ``search.toml`` ({} when there is none) and why it cannot be read (None when it
    can): a broken one costs the report only what it reads there, so it is no error."""
    path = search_dir / SEARCH_TOML
    try:
        return (read_toml(path) if path.is_file() else {}), None
    except HeadwiseError as e:
        return {}, str(e)


def load_search_record(search_dir: str | Path) -> SearchRecord:
    """The search's ``trials.json`` and its saved ``search.toml``; a missing or malformed
    ``trials.json`` is a HeadwiseError."""
    path = Path(search_dir) / TRIALS_JSON
    if not path.is_file():
        raise HeadwiseError(f"{Path(search_dir)} is not a search folder (no {TRIALS_JSON}); run `headwise search`")
    saved, problem = read_saved(Path(search_dir))
    try:
        d = json.loads(path.read_text())
        if not d["objectives"]:
            raise ValueError("no objectives")
        return SearchRecord(str(d["search"]), str(d.get("preset") or ""),
                      [Objective(metric=o["metric"], direction=o.get("direction", "minimize")) for o in d["objectives"]],
                      dict(d.get("budget") or {}), [Trial.from_dict(t) for t in d["trials"]],
                      list(d.get("named") or []), saved, problem)
    except (ValueError, KeyError, TypeError) as e:
        raise HeadwiseError(f"{path}: not a search's trials file ({type(e).__name__}: {e})") from e
