"""The report as a document: markdown lines, and figures saved beside it as PNG with the CSV of
what each draws. Every file is written atomically (a crash leaves the old one or the new one).

Figures use matplotlib's object API with the Agg canvas: no display, no global pyplot state.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from headwise.config import atomic_write_bytes, atomic_write_text
from headwise.study.results import rows_to_csv

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Document:
    """Markdown being written into ``out``, with its figures."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        """Append lines as one block (a heading is set apart from what follows it)."""
        for k, line in enumerate(lines):
            self.lines.append(line)
            if line.startswith("#") and k < len(lines) - 1:
                self.lines.append("")
        self.lines.append("")

    def table(self, headers: list[str], rows: Iterable[list[Any]]) -> None:
        """A markdown table (``|`` inside a cell becomes ``/``)."""
        self.lines.append("| " + " | ".join(headers) + " |")
        self.lines.append("|" + "|".join("---" for _ in headers) + "|")
        for r in rows:
            self.lines.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
        self.lines.append("")

    def figure(self, name: str, fig: Figure, rows: list[dict[str, Any]], caption: str) -> None:
        """Save ``fig`` as NAME.png and ``rows`` as NAME.csv, and link both."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=130)
        atomic_write_bytes(self.out / f"{name}.png", buf.getvalue())
        atomic_write_text(self.out / f"{name}.csv", rows_to_csv(rows))
        self.add(f"![{caption}]({name}.png)", f"*{caption}* Data: [{name}.csv]({name}.csv).")

    def data(self, name: str, rows: list[dict[str, Any]], caption: str) -> None:
        """Save ``rows`` as NAME.csv and link it: a table's numbers unrounded, where no figure
        carries them."""
        atomic_write_text(self.out / f"{name}.csv", rows_to_csv(rows))
        self.add(f"*{caption}* Data: [{name}.csv]({name}.csv).")

    def mark(self) -> int:
        """A position to :meth:`insert` at later."""
        return len(self.lines)

    def insert(self, at: int, lines: list[str]) -> None:
        """Insert lines at a :meth:`mark` (e.g. the findings, known only once the sections are written)."""
        self.lines[at:at] = lines

    def write(self, name: str) -> Path:
        """Write the markdown as NAME in ``out``; returns its path."""
        path = self.out / name
        atomic_write_text(path, "\n".join(self.lines).rstrip() + "\n")
        return path


def new_figure(width: float = 7.5, height: float = 4.6, ncols: int = 1, nrows: int = 1,
               sharey: bool = False) -> tuple[Figure, Any]:
    """A figure and its axes as a 2-d array (``axes[row, col]``)."""
    from matplotlib.figure import Figure  # on first use: parsing a study loads the layouts, not matplotlib

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    return fig, axes


def finish(ax: Any, xlabel: str, ylabel: str = "", title: str = "", legend: int | None = 8) -> None:
    """An axes' last touches: its labels and title (each where given), a light grid and its
    legend at font size ``legend`` (None: no legend)."""
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=legend)


def log2_ticks(ax: Any, values: Iterable[float]) -> None:
    """A log-2 x axis ticked at exactly ``values``."""
    vals = sorted({v for v in values if v and v > 0})
    if not vals:
        return
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in vals])


def fixed_ticks(ax: Any, values: Iterable[float]) -> None:
    """x ticks at exactly ``values``."""
    from matplotlib.ticker import FixedLocator

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))


def dodge(xs: Iterable[float], k: int, n: int, span: float, share: float = 0.012) -> list[float]:
    """``xs`` of series ``k`` of ``n`` moved sideways by a share of the axis ``span`` per series,
    centred on the true values, so that error bars of series sharing an x value stand side by
    side instead of on top of each other (the figures' CSVs keep the true values)."""
    offset = (k - (n - 1) / 2) * share * span
    return [x + offset for x in xs]


#: Where a point's label goes, one side per series, so that labels of nearby points do not collide.
LABEL_SIDES = [(6, 5, "left"), (6, -12, "left"), (-6, -12, "right"), (-6, 5, "right")]


def label_points(ax: Any, xs: Iterable[float], ys: Iterable[float], labels: Iterable[str], color: str, side: int,
                 **style: Any) -> None:
    """Each point (x, y) labelled, small and in ``color``, on side ``side`` of :data:`LABEL_SIDES`."""
    dx, dy, ha = LABEL_SIDES[side % len(LABEL_SIDES)]
    for x, y, text in zip(xs, ys, labels):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=7, color=color, **style)


# --------------------------------------------------------------------------- formatting


def fmt(x: Any, digits: int = 4) -> str:
    """A number for a table cell; missing or non-finite is an en dash."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def fmt_params(n: Any) -> str:
    """A parameter count: ``2.20M``, ``9.5k``."""
    if not isinstance(n, (int, float)):
        return "–"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return str(int(n))


def fmt_p(p: float) -> str:
    """A p-value."""
    if not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def plural(count: int, word: str) -> str:
    """``1 layer``, ``2 layers``."""
    return f"{count} {word}" + ("" if count == 1 else "s")


def heads_str(heads: list[int]) -> str:
    """Heads per layer: ``12 x 12`` when uniform and deep, else the list."""
    if not heads:
        return "–"
    if len(set(heads)) == 1 and len(heads) > 4:
        return f"{heads[0]} x {len(heads)}"
    return ", ".join(map(str, heads))


def quote(text: str) -> str:
    """``text`` as a markdown block quote."""
    return "\n".join("> " + line if line.strip() else ">" for line in text.strip().splitlines())
