"""The layouts of ``headwise report``: one per study kind, found by the ``[report] kind`` name.

A layout is a :class:`Layout` subclass in a ``report`` (or ``report_*``) module of a family
folder (:mod:`headwise.families`) that registers itself::

    @register_layout
    class VisionLayout(Layout):
        kind = "vision"
        Options = VisionOptions          # its keys of the [report] table, validated

        def sections(self, doc): ...     # its own sections; returns the findings

Every family's report modules are imported the first time the kinds are listed or a kind not
registered yet is looked up (:func:`headwise.families.import_family_modules`), so a new study kind
adds one module to its family's folder and touches no other file. The common sections (results
table, time, eval curves, conditioning, samples) ask the layout how to group and label variants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar

from headwise.config import Config
from headwise.families import import_family_modules
from headwise.registry import Registry

if TYPE_CHECKING:
    from headwise.report.data import StudyRuns, VariantRuns
    from headwise.report.document import Document
    from headwise.report.probes import Probes


class LayoutOptions(Config):
    """A layout's own keys of the ``[report]`` table (series, baseline, paper reference values);
    subclasses declare them as fields."""


class PaperReference(Config):
    """What every quoted publication names: who reported it and where, and what it leaves open;
    each layout's reference adds its own rows (``[report.paper]``)."""

    #: who reported it ("the paper"), and where ("Table 2")
    source: str
    table: str
    #: what the publication leaves open, after the numbers
    caveat: str = ""

    @property
    def citation(self) -> str:
        """Who reported it and where, to open a sentence: ``The paper's Table 4``."""
        return f"{self.source[:1].upper()}{self.source[1:]}'s {self.table}"


class Layout:
    """How one kind of study is reported. Subclasses set :attr:`kind` and :attr:`Options` and
    write their sections; the defaults below suit studies that vary depth and heads."""

    #: the ``[report] kind`` this layout answers to
    kind: ClassVar[str]
    #: the class that validates the layout's keys of the ``[report]`` table
    Options: ClassVar[type[LayoutOptions]] = LayoutOptions
    #: whether the report measures the attention conditioning of the final models
    conditioning: ClassVar[bool] = True
    #: what the conditioning figure's x axis shows (see :meth:`conditioning_x`), and its caption's words
    conditioning_label: ClassVar[str] = "total attention heads"
    conditioning_caption: ClassVar[str] = "total heads"

    def __init__(self, study: StudyRuns, options: LayoutOptions, probes: Probes,
                 echo: Callable[[str], None]) -> None:
        self.study = study
        self.options: Any = options
        self.probes = probes
        self.echo = echo
        self.setup()

    def setup(self) -> None:
        """Derive what the layout's sections share (series, baseline, grid) from the study."""

    def sections(self, doc: Document) -> list[str]:
        """Write the layout's own sections into ``doc``; returns the findings for the summary."""
        raise NotImplementedError

    def group(self, v: VariantRuns) -> str:
        """The colour group of a variant in the time and conditioning figures."""
        return self.panel(v)

    def panel(self, v: VariantRuns) -> str:
        """The eval-curve panel a variant is drawn in."""
        return f"{v.n_layers} layers"

    def panel_order(self, first: dict[str, VariantRuns]) -> list[str]:
        """Panels (each with its first variant) in the order they are drawn: by depth, then by
        sequence length."""
        return sorted(first, key=lambda t: (first[t].n_layers or 0, first[t].n_points or 0))

    def conditioning_x(self, v: VariantRuns) -> float:
        """Where a variant sits on the conditioning figure's x axis."""
        return float(v.total_heads or 0)


#: every layout by its ``[report] kind``; each family's ``report`` and ``report_*`` modules
#: register theirs
LAYOUTS: Registry[type[Layout]] = Registry("report kind", discover=lambda: import_family_modules("report"))


def register_layout(cls: type[Layout]) -> type[Layout]:
    """Class decorator: make ``cls`` the layout of ``cls.kind`` (a kind is registered once)."""
    return LAYOUTS.register(cls.kind, cls)


def layout_kinds() -> list[str]:
    """The registered kinds, sorted."""
    return LAYOUTS.names()


def get_layout(kind: str) -> type[Layout]:
    """The layout registered for ``kind``; an unknown kind is a one-line HeadwiseError."""
    return LAYOUTS.get(kind)
