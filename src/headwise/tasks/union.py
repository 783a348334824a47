"""The ``[task]`` table of a run config: one table per registered task family, told apart by ``kind``.

    [task]                     # no kind: the family whose config allows it (language modelling)
    source = "tinystories-train-sample.txt"
    tokenizer = "bpe:4096"
    validation = "tinystories-valid-sample.txt"

    [task]
    kind = "nearest"
    dim = 16
    n_points = 8

The union of tables is built from the family registry (:func:`headwise.tasks.family.families`,
which finds every family folder), so a new family is accepted here without a change. A table
without ``kind`` belongs to the one family whose config says so (``kind_optional``), so that
configs written before there was more than one family still load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag

from headwise.errors import HeadwiseError
from headwise.tasks.base import Task
from headwise.tasks.family import TaskConfigBase, families

if TYPE_CHECKING:
    from headwise.text.tokenizer import Tokenizer

__all__ = ["TaskConfig", "build_task", "parse_task_config"]


def implied_kind() -> str | None:
    """The kind of a ``[task]`` table that names none: that of the family whose config sets
    ``kind_optional`` (None when no family does; more than one is an error)."""
    kinds = [kind for kind, f in families().items() if f.config.kind_optional]
    if len(kinds) > 1:
        raise HeadwiseError(f"task families {' and '.join(sorted(kinds))} both take a [task] table without kind")
    return kinds[0] if kinds else None


def _task_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return value["kind"] if "kind" in value else implied_kind()
    return getattr(value, "kind", None)


TaskConfig = Annotated[
    Union[tuple(Annotated[f.config, Tag(kind)] for kind, f in families().items())],  # type: ignore[misc]
    Discriminator(_task_kind),
]


def parse_task_config(data: dict[str, Any], source: str = "[task]") -> TaskConfigBase:
    """Validate a ``[task]`` table on its own, raising a one-line HeadwiseError on failure."""
    kind = _task_kind(data)
    known = families()
    if kind is None:
        raise HeadwiseError(f"{source}: the table names no kind; use one of: {', '.join(sorted(known))}")
    if kind not in known:
        raise HeadwiseError(f"{source}: unknown task kind {kind!r}; use one of: {', '.join(sorted(known))}")
    return known[kind].config.parse(data, source=source)


def build_task(cfg: TaskConfigBase, cache_dir: str | Path | None = None, progress: bool = False,
               tokenizer: Tokenizer | None = None) -> Task:
    """The task a config describes, its data prepared (or reused); ``tokenizer`` (a run's saved
    one: only the text families take it) encodes the text instead of one learnt on it."""
    if tokenizer is None:
        return cfg.build(cache_dir=cache_dir, progress=progress)
    return cfg.build(cache_dir=cache_dir, progress=progress, tokenizer=tokenizer)
