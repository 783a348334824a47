"""Models another library builds, named in a run's ``[model]`` by a table of their own
(``[model.timm]``: a timm image model with Leaner Transformers' changes) instead of ModelSpec's
fields.

A family registers its source's spec class under the table's name (:data:`MODEL_SOURCES`). The
spec is a typed config that resolves once against a task's shape (:meth:`ModelSource.resolve`),
builds its model, counts it, and saves as ``{table: fields}``: in a resolved run config's
``[model]`` and in a checkpoint's ``spec.json``. The trainer, checkpoints and resume then treat
every model through the few methods :class:`ModelSpec <headwise.spec.ModelSpec>` has too
(``build``, ``parameter_count``, ``flops_per_token``, ``kv_cache_budget``, ``analyze``,
``heads_line``, ``d_model``). Importing this module imports no family and no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from headwise.registry import Registry

if TYPE_CHECKING:
    from headwise.plans import Plan
    from headwise.tasks.base import TaskShape


class ModelSource(Protocol):
    """What a registered source's spec class offers (besides the run-model methods above)."""

    @classmethod
    def resolve(cls, fields: dict[str, Any], shape: TaskShape, where: str) -> tuple[Any, Plan]:
        """The spec of ``[model.<table>]`` ``fields`` for a task of ``shape``, checked (one-line
        HeadwiseError naming ``where``), and its head plan."""

    @classmethod
    def parse(cls, data: dict[str, Any], source: str = "config") -> Any:
        """A saved spec's fields read back (a resolved one: no task is needed)."""


def _discover() -> None:
    from headwise.families import import_family_modules

    import_family_modules("model_source")


#: the spec class of each source, by the ``[model]`` table that names it
MODEL_SOURCES: Registry[type[ModelSource]] = Registry("model source", discover=_discover)


def source_table(fields: dict[str, Any]) -> str | None:
    """The table of ``fields`` (a ``[model]`` table or a saved spec) that names a model source;
    None for a headwise ModelSpec."""
    tables = [key for key, value in fields.items() if isinstance(value, dict) and key in MODEL_SOURCES]
    return tables[0] if tables else None


def read_source_spec(data: dict[str, Any], source: str) -> Any | None:
    """The spec of a source saved as ``{table: fields}``; None when ``data`` names no source."""
    table = source_table(data)
    if table is None:
        return None
    return MODEL_SOURCES[table].parse(data[table], source=source)
