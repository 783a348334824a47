"""The sections of ``headwise bench``, one registry: each section registers itself with its name,
a one-line description, its place in the suite, what it measures and how the report shows it.

The shared sections are written in :mod:`headwise.bench` (the training sections, generation,
Nyström attention, the GPU rerun); a family's in its folder's ``bench`` module
(``families/vision/bench.py``), found on the first lookup through
:func:`headwise.families.import_family_modules`, so a new section edits no shared file.

Sections run, are listed and are reported in the order of their ``order`` (the suite's own
sections 10-50, the families' 60-90, the GPU rerun of the others last). Several sections may
share one measurement (the four training sections time the same cases in one pass): it runs
once, when any of them is chosen, and its targets and tables are reported once.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from headwise.bench.core import load_snapshot
from headwise.bench.settings import BenchConfig
from headwise.errors import HeadwiseError
from headwise.registry import Registry

#: the suite's own section modules (each registers its sections on import)
SHARED_MODULES = ("headwise.bench.training", "headwise.bench.generation", "headwise.bench.nystrom",
                  "headwise.bench.gpu")

T = TypeVar("T")
#: a section's targets or markdown lines, from a result document
Rows = Callable[[dict[str, Any]], list[Any]]


@dataclass(frozen=True)
class SuiteRun:
    """What a section's measurement is given: the run's sizes, the sections chosen, the result
    document it writes its part into and the progress log."""

    cfg: BenchConfig
    sections: frozenset[str]
    result: dict[str, Any]
    log: Callable[[str], None]

    def snapshot(self, when: str) -> None:
        """Record the machine's load now in the result, as ``when`` (``"after vision"``)."""
        self.result["load"][when] = load_snapshot()


@dataclass(frozen=True)
class BenchSection:
    """One section of the suite."""

    name: str
    #: what it measures, in one line (``headwise bench --list``)
    help: str
    #: where it runs, is listed and is reported (see the module doc)
    order: int
    #: runs the measurement into ``run.result``
    measure: Callable[[SuiteRun], None]
    #: its targets, from a result document (its part may be missing: then none)
    targets: Rows | None = None
    #: its markdown, from a result document (its part may be missing: then no lines)
    render: Rows | None = None
    #: part of a plain ``headwise bench``; False: only when ``--only`` names it (a section that
    #: takes many minutes beside the others' few)
    by_default: bool = True


def of_part(key: str) -> Callable[[Rows], Rows]:
    """Let a section's targets or table, written for its part of the result document
    (``result[key]``), take the whole document: none where the part is missing."""
    def wrap(fn: Rows) -> Rows:
        return functools.wraps(fn)(lambda result: [] if result.get(key) is None else fn(result[key]))
    return wrap


def measure_part(run: SuiteRun, name: str, key: str, why: str | None,
                 measure: Callable[[], dict[str, Any]]) -> None:
    """Section ``name``'s part of the result: ``measure()`` into ``run.result[key]``, the machine's
    load recorded after it. Where the section cannot run here (``why`` says why; ``None``: it can),
    ``{"skipped": why}`` instead, or, when it is the only section chosen, a refusal."""
    if why is not None:
        if run.sections == {name}:
            raise HeadwiseError(f"section {name!r} cannot run: {why}")
        run.result[key] = {"skipped": why}
        return
    run.result[key] = measure()
    run.snapshot(f"after {name}")


def _discover() -> None:
    from headwise.families import import_family_modules

    for name in SHARED_MODULES:
        importlib.import_module(name)
    import_family_modules("bench")


#: every section of ``headwise bench`` by name
SECTIONS: Registry[BenchSection] = Registry("benchmark section", discover=_discover)


def register_section(section: BenchSection) -> BenchSection:
    """Add a section to the suite (once per name); returns it."""
    return SECTIONS.register(section.name, section)


def ordered_sections() -> list[BenchSection]:
    """Every section, in the suite's order."""
    return sorted((s for _, s in SECTIONS.items()), key=lambda s: (s.order, s.name))


def section_names() -> list[str]:
    """The sections' names, in the suite's order."""
    return [s.name for s in ordered_sections()]


def default_section_names() -> list[str]:
    """The sections a plain ``headwise bench`` runs, in the suite's order."""
    return [s.name for s in ordered_sections() if s.by_default]


def once(parts: Iterable[T | None]) -> list[T]:
    """The distinct parts in order, each once (sections may share a measurement, targets or
    tables), None left out."""
    out: list[T] = []
    for part in parts:
        if part is not None and all(part is not seen for seen in out):
            out.append(part)
    return out
