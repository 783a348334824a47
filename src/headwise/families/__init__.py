"""The task families, one folder each: everything that belongs to one kind of task.

    families/lm/        language modelling (TinyStories): task, token caches, tokenizers, packing,
                        the heads and depth report layouts, the progression and depth-for-heads studies
    families/nearest/   the nearest-neighbour target (Amsel et al.): task, the rank layout and study
    families/vision/    image classification (ViTs): task, image readers and caches, augmentation,
                        the vision layout, the vit study, the vision bench section
    families/lra/       Long Range Arena: task and its one task table, readers, ListOps, the
                        sequence cache, the lra layout and study
    families/encoder/   Crammed BERT: masked-LM pretraining, GLUE fine-tuning and its offline
                        stand-ins, the encoder layout (Table 1) and study

A family folder's ``__init__`` registers its :class:`~headwise.tasks.family.TaskFamily` (by
importing its task module); its ``report*`` modules register its report layouts
(:mod:`headwise.report.registry`) and its ``*.toml`` files are built-in studies
(:func:`headwise.study.definition.builtin_studies`). What the families share (batches, cache files,
shuffling, sources and hub access, classification) lives in :mod:`headwise.data` and
:mod:`headwise.tasks`.

Families are found, never listed: :func:`family_packages` is every subpackage of this package,
then every package named by an installed distribution's ``headwise.families`` entry point (so a
family outside headwise is a package plus one line of packaging metadata). Adding a family edits
no file outside its folder.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType

#: the entry-point group through which installed distributions add families
ENTRY_POINT_GROUP = "headwise.families"


@cache
def family_packages() -> tuple[str, ...]:
    """The import names of every family package: this package's subpackages (sorted), then those
    named by ``headwise.families`` entry points (in their distributions' order)."""
    built_in = sorted(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.ispkg)
    plugged = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value not in built_in]
    return (*built_in, *dict.fromkeys(plugged))


def load_families() -> list[ModuleType]:
    """Import every family package (each registers its family on import); returns them."""
    return [importlib.import_module(name) for name in family_packages()]
