"""``ReportSpec``: the ``[report]`` table of a study file.

    [report]
    kind = "heads"                 # a registered layout (headwise.report.registry)
    series = "scheme"              # ... and that layout's own keys
    baseline = "constant"
    prompt = "Once upon a time"    # keys every layout shares (the samples section)

    [report.paper]                 # e.g. reference values from the paper the study follows
    ...

The shared keys are fields here; the layout's keys are validated by the layout's own options
class, so that a new kind brings its keys without changing this class. Unknown keys are a
one-line error with a "did you mean". Without ``kind`` the study is reported with the layout of
its task family (:attr:`headwise.tasks.family.TaskFamily.report_layout`), at its defaults.

The study keeps the table as written (it does not depend on the report): :func:`study_report`
checks it, where ``headwise report`` reads a study and where ``headwise study`` starts one.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from headwise.config import Config, describe_validation_error
from headwise.errors import HeadwiseError
from headwise.report.registry import LayoutOptions, get_layout, layout_kinds


class ReportSpec(Config):
    """How ``headwise report`` lays the study out: the layout (``kind``), its options, and the
    settings of the text samples."""

    # The layout's keys sit in the same table; they are kept as given (so that the study saves
    # them as written) and validated by the layout in :meth:`_layout_keys`.
    model_config = ConfigDict(extra="allow")

    #: the registered layout: heads (the blog), depth (Leaner Transformers), rank (Amsel et al.), ...;
    #: None: the layout of the study's task family
    kind: str | None = None
    prompt: str = "Once upon a time there was"
    temperature: float = Field(default=0.9, gt=0)
    sample_tokens: int = Field(default=500, gt=0)

    _options: LayoutOptions | None = PrivateAttr(default=None)

    @field_validator("kind")
    @classmethod
    def _registered(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                get_layout(v)
            except HeadwiseError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _layout_keys(self) -> "ReportSpec":
        given = dict(self.model_extra or {})
        if self.kind is None:
            if given:  # which layout they belong to is not known until the task is
                raise ValueError(f"keys {', '.join(map(repr, given))} belong to a layout: name it with `kind` "
                                 f"(kinds: {', '.join(layout_kinds())})")
            return self
        options_cls = get_layout(self.kind).Options
        for key in given:
            if key not in options_cls.model_fields:
                known = [*type(self).model_fields, *options_cls.model_fields]
                hint = difflib.get_close_matches(key, known, n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else f"; valid keys: {', '.join(known)}"
                raise ValueError(f"unknown key {key!r} for report kind {self.kind!r}{extra}")
        try:
            self._options = options_cls.model_validate(given)
        except ValidationError as exc:
            raise ValueError(describe_validation_error(options_cls, exc, f"report kind {self.kind!r}")) from None
        return self

    @property
    def options(self) -> Any:
        """The layout's keys, validated and typed (its ``Options`` class, defaults filled in);
        only once the kind is known (see :meth:`with_kind`)."""
        if self._options is None:
            raise HeadwiseError("[report] names no kind: settle it with ReportSpec.with_kind first")
        return self._options

    def with_kind(self, kind: str) -> "ReportSpec":
        """This spec with ``kind`` as its layout when it names none (e.g. its task family's)."""
        return self if self.kind is not None else ReportSpec.parse({**self.to_dict(), "kind": kind})


class _StudyTables(Config):
    """The study's tables the report reads: its errors name the key as the study's own checks
    name theirs (``report.kind: ...``)."""

    report: ReportSpec = Field(default_factory=ReportSpec)


def study_report(table: Any, source: str) -> ReportSpec:
    """A study's ``[report]`` table as its definition keeps it (None: the study has none),
    validated; a one-line HeadwiseError naming ``source`` and the key otherwise."""
    return _StudyTables.parse({} if table is None else {"report": table}, source=source).report
