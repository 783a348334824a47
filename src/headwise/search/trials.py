"""The trials record, ``SEARCH_DIR/trials.json``: every trial of the search as the report reads it,
rewritten atomically from the store each time a trial ends.

    {"search": "progression", "preset": "quick",
     "objectives": [{"metric": "loss", "direction": "minimize"}],
     "budget": {"metric": "total_heads", "max": null, "min": null, "target": 180},
     "n_trials": 8,
     "named": [{"name": "constant", "heads": [...], "in_space": false, "note": "..."}],
     "trials": [{"number": 0, "state": "complete", "params": {"layer0.heads": 48, ...},
                 "depth": 4, "heads": [...], "head_dims": [...], "kv_heads": [], "mlp_hidden": [],
                 "budget": {"params": ..., "flops_per_token": ..., "kv_bytes_per_token": ..., "total_heads": ...},
                 "lr": 0.004, "repaired": {"layer3.heads": 64},
                 "values": {"loss": 3.21}, "steps": 60, "run_dir": "trials/0000",
                 "duplicate_of": null, "named": "ascending", "startup": null, "note": ""}, ...]}

A trial's ``state`` is ``complete``, ``pruned`` (its values: the last reported), ``duplicate`` (its
plan's run config is an earlier trial's: it reuses that trial's values, run directory and steps,
and trains nothing), ``running`` or ``failed``. ``kv_heads`` and ``mlp_hidden`` are empty when the
space leaves them to the base model. ``params`` are the plan's values as Optuna drew them (and
``optim.lr`` where the space searches it; ``lr`` is then the trial's learning rate, else null);
``repaired`` names what the sampler proposed for each value it repaired to keep the budget;
``named`` is the named plan a trial ran, ``startup`` ``"uniform"`` for a plan the driver queued
from the space's list for TPE's start (:func:`headwise.search.driver.enqueue_named`). The Optuna
study holds the same plan fields as each trial's user attributes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwise.config import atomic_write_text
from headwise.search.definition import Search
from headwise.search.record import TRIALS_JSON

#: the plan fields a trial carries as Optuna user attributes (and in the record)
PLAN_FIELDS = ("depth", "heads", "head_dims", "kv_heads", "mlp_hidden", "budget", "lr", "repaired")
#: what the record gives for a field a trial lacks
EMPTY = {"depth": None, "budget": None, "lr": None, "repaired": {}}


def _state(trial: Any) -> str | None:
    name = trial.state.name
    if trial.user_attrs.get("duplicate_of") is not None and name in ("COMPLETE", "PRUNED"):
        return "duplicate"
    return {"COMPLETE": "complete", "PRUNED": "pruned", "RUNNING": "running", "FAIL": "failed"}.get(name)


def trial_record(trial: Any, search: Search) -> dict[str, Any] | None:
    """One trial of the store as the record lists it (None for a trial still queued)."""
    state = _state(trial)
    if state is None:
        return None
    attrs = trial.user_attrs
    metrics = [o.metric for o in search.config.objectives]
    values: dict[str, float] = {}
    if trial.state.name == "COMPLETE" and trial.values is not None:
        values = dict(zip(metrics, trial.values))
    elif trial.state.name == "PRUNED":
        values = dict(attrs.get("last_values", {}))
    # the record's keys in a fixed order, as the docstring lists them
    return {"number": trial.number, "state": state, "params": dict(trial.params),
            **{k: attrs.get(k, EMPTY.get(k, [])) for k in PLAN_FIELDS}, "values": values,
            "steps": int(attrs.get("steps", 0)), "run_dir": attrs.get("run_dir"), "duplicate_of": attrs.get("duplicate_of"),
            "named": attrs.get("named"), "startup": attrs.get("startup"), "note": attrs.get("note", "")}


def build_record(search: Search, trials: list[Any]) -> dict[str, Any]:
    """The whole record from the store's trials."""
    budget = search.config.budget
    return {
        "search": search.name,
        "preset": search.preset or "",
        "objectives": [{"metric": o.metric, "direction": o.direction} for o in search.config.objectives],
        "budget": None if budget is None else {"metric": budget.metric, "max": budget.max, "min": budget.min,
                                               "target": budget.target},
        "n_trials": search.config.trials,
        "named": [{"name": n.name, "heads": list(n.plan.heads) if n.plan else [], "in_space": n.in_space, "note": n.note}
                  for n in search.named],
        "trials": [r for r in (trial_record(t, search) for t in sorted(trials, key=lambda t: t.number)) if r],
    }


def write_record(search_dir: Path, search: Search, trials: list[Any]) -> dict[str, Any]:
    """Rewrite ``trials.json`` (atomically) from the store's trials; returns the record."""
    record = build_record(search, trials)
    atomic_write_text(search_dir / TRIALS_JSON, json.dumps(record, indent=1) + "\n")
    return record


def read_record(search_dir: Path) -> dict[str, Any]:
    """The trials record of a search folder."""
    return json.loads((Path(search_dir) / TRIALS_JSON).read_text(encoding="utf-8"))
