"""Search for a head allocation under a budget (``headwise search``), with Optuna.

    from headwise.search import load_search
    from headwise.search.runner import run_search
    search = load_search("progression", preset="quick")
    outcome = run_search(search, "searches_out/progression-quick")

- :mod:`~headwise.search.definition`: a search file (or a family's built-in ``search-*.toml``)
  resolved: base run, space, budget, objectives, fidelity, named plans, confirmation;
- :mod:`~headwise.search.space` and :mod:`~headwise.budget`: the optimiser's values to plans
  that meet the budget, computed exactly from each plan's spec;
- :mod:`~headwise.search.store`, :mod:`~headwise.search.driver`, :mod:`~headwise.search.execute`:
  the Optuna study, the ask-and-tell loop over ordinary headwise runs (resumable, shared by
  workers), one trial's run with pruning on its eval curve;
- :mod:`~headwise.search.runner`, :mod:`~headwise.search.layout`, :mod:`~headwise.search.trials`:
  the checks before anything is written, the search folder, the trials record;
- :mod:`~headwise.search.confirm`: the verdict study of the best plans against the named ones.

The search sits above the study (its trials are study jobs, its confirmation a study) and the
report (the confirmation's report is the study's).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_search"]


def load_search(name_or_path: str, preset: str | None = None, overrides: list[str] | None = None,
                trials: int | None = None) -> Any:
    """A built-in search (by name) or a search file, resolved and checked, its confirmation
    included (a :class:`headwise.search.definition.Search`)."""
    from headwise.search.confirm import check_confirm
    from headwise.search.definition import load_search_file, resolve_search

    raw, source = load_search_file(name_or_path)
    search = resolve_search(raw, source, preset=preset, overrides=overrides, trials=trials)
    if search.config.confirm.enabled:  # refused before any trial, not after the search
        check_confirm(search)
    return search
