"""What the layouts that quote a published table share (the depth layout's Table 2, the vision
layout's Table 4, the encoder layout's Table 1, the lra layout's Table 3): a model row's shape,
parameters and memory, the table's rows and claim, and the ``[report]`` keys that name the
baseline variant, the headline rows and the paper.

A layout's own row adds what the paper scores (top-1 accuracy, GLUE scores); its reference is
``PaperTable[ItsRow]`` and its options ``BaselineOptions[ItsReference]``, so ``[report.paper]`` is
checked whole.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import Field

from headwise.config import Config
from headwise.report.registry import LayoutOptions, PaperReference


class PaperRow(Config):
    """One model of a published table: its shape, parameters and (where reported) training memory."""

    shape: str
    params: float = Field(gt=0)
    memory_gb: float | None = Field(default=None, gt=0)


RowT = TypeVar("RowT", bound=Config)


class PaperTable(PaperReference, Generic[RowT]):
    """A published table of models (rows of a layout's own row class, a :class:`PaperRow` where its
    rows have a shape, parameters and memory) and its claim."""

    rows: list[RowT] = Field(min_length=1)
    #: what the publication claims, which the findings test
    claim: str = ""


TableT = TypeVar("TableT", bound=PaperReference)


class BaselineOptions(LayoutOptions, Generic[TableT]):
    """The ``[report]`` keys of a layout that sets variants against a baseline beside a paper's
    table (a layout's own :class:`PaperTable`, or another :class:`PaperReference`)."""

    #: the variant the others are compared against (the original model)
    baseline: str | None = None
    #: the variants of the headline table
    table: list[str] | None = None
    paper: TableT | None = None
