"""Studies: many runs from one definition, run resumably (locally or on Ray), with their results.

    from headwise.report import write_report
    from headwise.study import load_study, run_study
    study = load_study("progression", preset="tiny", seeds=1)
    outcome = run_study(study, "studies_out/progression-tiny", jobs=2, report=write_report)

- :mod:`~headwise.study.definition`: a study file (or a family's built-in one) resolved into its
  variants' run configs, with ``[[stages]]`` (:mod:`~headwise.study.stages`), ``[[claims]]``
  (:mod:`~headwise.study.claims`) and ``[nuisance]`` (:mod:`~headwise.study.nuisance`);
- :mod:`~headwise.study.runner`: every run, resumably, as :mod:`~headwise.study.jobs`, after the
  checks of :mod:`~headwise.study.preflight`; each run through :mod:`~headwise.study.worker`,
  locally or on Ray (:mod:`~headwise.study.ray_backend`); the nuisance settings tuned first
  (:mod:`~headwise.study.tuning`);
- :mod:`~headwise.study.layout`, :mod:`~headwise.study.results`: where a study keeps things, and
  its results table.

The report (:mod:`headwise.report`) reads a study directory; the study does not depend on it (it
keeps the ``[report]`` table as written, and ``headwise study`` hands the runner the report's
``write_report``).

Nothing heavy is imported with the package itself: every run starts through
:mod:`headwise.study.worker`, which should not pay for plotting and statistics.
"""

from __future__ import annotations

from typing import Any

from headwise.lazy import lazy_exports

__all__ = ["load_study", "run_study"]


def load_study(name_or_path: str, preset: str | None = None, seeds: int | None = None,
               overrides: list[str] | None = None) -> Any:
    """A built-in study (by name) or a study file, with its preset merged and every variant's run
    config checked (a :class:`headwise.study.definition.Study`); ``overrides`` (``key=value``) apply to
    the base run config."""
    from headwise.study.definition import load_study_file, resolve_study

    raw, source = load_study_file(name_or_path)
    return resolve_study(raw, source, preset=preset, seeds=seeds, overrides=overrides)


# run_study on first use: it pulls in the runner and the launchers
__getattr__ = lazy_exports(__name__, {"run_study": "headwise.study.runner"})
