"""The task families, one folder each: everything that belongs to one kind of task.

    families/lm/        language modelling (TinyStories): task, presets, the tokenize bench
                        section, the heads and depth report layouts, the progression and
                        depth-for-heads studies
    families/nearest/   the nearest-neighbour target (Amsel et al.): task, presets, the rank
                        layout and study
    families/vision/    image classification (ViTs): task, image readers and caches, augmentation,
                        presets, the vision layout, the vit study, the vision bench section
    families/lra/       Long Range Arena: task and its one task table, readers, ListOps, the
                        sequence cache, Retrieval's pair models (the ``token_pairs`` front end
                        and ``pair_classes`` head), the lra layout and study
    families/encoder/   Crammed BERT: masked-LM pretraining and its masking, GLUE fine-tuning and
                        its offline stand-ins, the ``mlm`` and ``cls_pooler`` output heads,
                        presets, the bench section, the encoder layout (Table 1) and study

A family folder's ``__init__`` registers its :class:`~headwise.tasks.family.TaskFamily` (by
importing its task module). Its other parts are found by the name of the module or file that
holds them, each registry importing every family's modules of one name on its first listing or
its first lookup of a name not registered yet (:func:`import_family_modules`):

    report, report_*     report layouts (:mod:`headwise.report.registry`)
    model, model_*       model front ends and output heads (:mod:`headwise.parts`) and attention
                         kinds (:mod:`headwise.model.attention`)
    presets              model presets (:mod:`headwise.presets`)
    bench                bench sections (:mod:`headwise.bench.sections`)
    *.toml               built-in studies (:func:`headwise.study.definition.builtin_studies`,
                         through :func:`family_files`); ``search-*.toml``: built-in searches
                         (:func:`headwise.search.definition.builtin_searches`)

What the families share lives below them and imports none of them: batches, cache files,
shuffling, sources and hub access in :mod:`headwise.data`; tokenizers, token caches, packing and
the masked LM's vocabulary in :mod:`headwise.text`; the task interface, classification and the
config and task bases of the tasks on text in :mod:`headwise.tasks`.

Families are found, never listed: :func:`family_packages` is every subpackage of this package,
then every package named by an installed distribution's ``headwise.families`` entry point (so a
family outside headwise is a package plus one line of packaging metadata). Adding a family edits
no file outside its folder.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from importlib import resources
from importlib.metadata import entry_points
from importlib.resources.abc import Traversable
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


def import_family_modules(stem: str) -> list[ModuleType]:
    """Import every family's modules named ``stem`` or ``stem_*`` (``report``, ``report_depth``),
    each of which registers its parts on import; returns them. The one walk over the families'
    folders that every registry's discovery uses."""
    modules = []
    for name in family_packages():
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__):
            if info.name == stem or info.name.startswith(f"{stem}_"):
                modules.append(importlib.import_module(f"{name}.{info.name}"))
    return modules


def family_files(suffix: str) -> list[Traversable]:
    """Every family folder's files whose names end in ``suffix`` (``".toml"``: the built-in
    studies), folder by folder in :func:`family_packages` order."""
    return [entry for name in family_packages() for entry in resources.files(name).iterdir()
            if entry.is_file() and entry.name.endswith(suffix)]
