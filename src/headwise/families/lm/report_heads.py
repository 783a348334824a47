"""The ``heads`` layout (the "Attention-Head Progression" blog): final eval loss against total
heads, one series per scheme (or any other run fact), with exponential fits, the fitted difference
from the baseline series at a chosen total, seed statistics and Welch's t-tests.

    [report]
    kind = "heads"
    series = "scheme"          # a run fact, an axis that sets one key, or a dotted config key
    baseline = "constant"      # the series the others are compared against
    at_heads = 180             # where the fits are compared (default: the largest total all reach)

    [report.paper]             # published fitted differences, quoted in the findings
    source = "the blog's fits"
    at_heads = 180
    difference = { descending = -0.3, ascending = 4.5 }
    note = "one seed each, d_model 768, 250k stories"
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from headwise.config import Config
from headwise.report import stats
from headwise.report.data import VariantRuns
from headwise.report.document import Document, dodge, finish, fmt, label_points, new_figure
from headwise.report.registry import Layout, LayoutOptions, register_layout
from headwise.report.sections import comparison_table


class FitReference(Config):
    """Published fitted differences between series, quoted beside the study's own."""

    #: who reported them, as it reads in "For comparison, SOURCE at 180 heads: ..."
    source: str
    at_heads: float = Field(gt=0)
    #: each series' fitted % difference from the baseline (negative: lower loss, better)
    difference: dict[str, float] = Field(min_length=1)
    #: the reference's setting, in parentheses after the numbers
    note: str = ""

    def sentence(self, baseline: str) -> str:
        """The comparison as one finding."""
        parts = [f"{s} {abs(d):g}% {'better' if d < 0 else 'worse'}" for s, d in self.difference.items()]
        joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        note = f" ({self.note})" if self.note else ""
        return f"For comparison, {self.source} at {self.at_heads:g} heads: {joined} than {baseline}{note}."


class HeadsOptions(LayoutOptions):
    """The ``[report]`` keys of the heads layout."""

    #: what splits the runs into series (None: one series of all runs)
    series: str | None = None
    #: the series the others are compared against
    baseline: str | None = None
    #: total heads at which the fitted curves are compared (None: the largest total every series reaches)
    at_heads: float | None = Field(default=None, gt=0)
    paper: FitReference | None = None


@register_layout
class HeadsLayout(Layout):
    """Loss against total heads per series, fits, and each variant against the baseline series at
    the same place on the other axes."""

    kind = "heads"
    Options = HeadsOptions

    def setup(self) -> None:
        opts: HeadsOptions = self.options
        self.series = self.study.series(opts.series) if opts.series else None
        order = list(dict.fromkeys(s for v in self.study.variants if (s := self.series_of(v)) is not None))
        self.base = opts.baseline if opts.baseline in order else None
        self.order = sorted(order, key=lambda s: s != self.base)  # the baseline is drawn and listed first
        self.colors = {s: f"C{i}" for i, s in enumerate(self.order)}

    def series_of(self, v: VariantRuns) -> str | None:
        """The series of a variant; None until one of its runs has written a summary."""
        return self.series.value(v) if self.series else "all"

    def group(self, v: VariantRuns) -> str:
        return self.series_of(v) or "–"

    def panel(self, v: VariantRuns) -> str:
        other = self.series.group(v) if self.series else tuple(v.labels.items())
        return ", ".join(f"{axis} {label}" for axis, label in other) or "all runs"

    def panel_order(self, first: dict[str, VariantRuns]) -> list[str]:
        return list(first)  # the study's own order of the other axes

    def members(self, s: str) -> list[VariantRuns]:
        """The completed variants of a series, by total heads."""
        return sorted((v for v in self.study.done if self.series_of(v) == s), key=lambda v: v.total_heads or 0)

    def sections(self, doc: Document) -> list[str]:
        fits: dict[str, stats.ExpFit | None] = {}
        for s in self.order:  # on every completed seed: one point per run
            pts = [(v.total_heads, x) for v in self.members(s) for x in v.losses]
            fits[s] = stats.fit_exponential([p[0] for p in pts], [p[1] for p in pts]) if pts else None
        fitted = [s for s in self.order if fits[s] is not None]
        at_heads = self.options.at_heads
        if at_heads is None and fitted:
            at_heads = float(min(self.members(s)[-1].total_heads for s in fitted))
        self._figure(doc, fits, at_heads)
        findings = self._fits_table(doc, fits, at_heads) if fitted else []
        if not fitted:
            doc.add("No fit: an exponential fit needs at least three distinct totals of heads per series; the "
                    "comparison below is between runs at the same budget.")
        return findings + self._significance(doc)

    def _figure(self, doc: Document, fits: dict[str, stats.ExpFit | None], at_heads: float | None) -> None:
        """Final eval loss against total heads: seeds, means, fits and the comparison total."""
        fig, axes = new_figure(8.0, 5.0)
        ax = axes[0, 0]
        rows: list[dict[str, Any]] = []
        totals = [v.total_heads for s in self.order for v in self.members(s)]
        span = (max(totals) - min(totals)) or max(totals) if totals else 1.0
        for k, s in enumerate(self.order):
            vs = self.members(s)
            if not vs:
                continue
            color = self.colors[s]
            xs = [v.total_heads for v in vs]
            drawn = dodge(xs, k, len(self.order), span)  # series at one total side by side
            multi = any(v.stats.n > 1 for v in vs)
            ax.errorbar(drawn, [v.stats.mean for v in vs], yerr=[v.stats.std if v.stats.n > 1 else 0.0 for v in vs]
                        if multi else None, fmt="o", color=color, capsize=3, label=s, zorder=3)
            label_points(ax, drawn, [v.stats.mean for v in vs], [",".join(map(str, v.heads)) for v in vs], color, k)
            for v, x in zip(vs, drawn):
                if v.stats.n > 1:
                    ax.scatter([x] * v.stats.n, v.losses, color=color, s=8, alpha=0.35, zorder=2)
                rows.append(dict(kind="point", series=s, variant=v.name, heads=" ".join(map(str, v.heads)),
                                 total_heads=v.total_heads, loss_mean=v.stats.mean,
                                 loss_sd=v.stats.std if v.stats.n > 1 else None, seeds=v.stats.n))
            fit = fits[s]
            if fit is not None:
                grid = np.linspace(xs[0], max(xs[-1], at_heads or 0), 200)
                ax.plot(grid, fit(grid), color=color, lw=1.2, alpha=0.8)
                rows += [dict(kind="fit", series=s, total_heads=float(x), loss_mean=float(fit(x))) for x in grid[::10]]
        fitted = any(f is not None for f in fits.values())
        if at_heads is not None and fitted:
            ax.axvline(at_heads, color="0.5", ls=":", lw=1)
        name = self.options.series or "series"
        finish(ax, "total attention heads (all layers)", "final eval loss",
               "Final eval loss vs total heads" + (" (lines: exponential fits)" if fitted else ""), legend=None)
        ax.legend(title=name)
        doc.add("## Loss vs total heads")
        doc.figure("loss_vs_heads", fig, rows, f"Final eval loss against the total number of heads, one colour per "
                   f"{name}; labels give the heads per layer"
                   + ("; error bars are ± one standard deviation over seeds, faint dots single seeds"
                      if self.study.record.seeds > 1 else "") + ".")

    def _fits_table(self, doc: Document, fits: dict[str, stats.ExpFit | None], at_heads: float | None) -> list[str]:
        """The fitted curves, and each one's difference from the baseline's at ``at_heads``."""
        findings: list[str] = []
        base, seeds = self.base, self.study.record.seeds
        doc.add(f"Fit form: `{stats.EXP_FORM}` (least squares on every completed run, `scipy.optimize.curve_fit` "
                "started from a grid search over c). With three totals per series the fit has no residual "
                "degrees of freedom: it interpolates, as the blog's fits did.")
        boot: dict[str, tuple[float, float]] = {}
        if base is not None and at_heads is not None and seeds > 1:
            pts = {s: [(v.total_heads, v.losses) for v in self.members(s)] for s in self.order if fits[s]}
            boot = stats.bootstrap_fit_difference(pts, base, at_heads)
        base_fit = fits.get(base) if base is not None else None
        rows = []
        for s in self.order:
            f = fits[s]
            if f is None:
                rows.append([s, "–", "–", "–", "–", "–", "too few distinct totals (need 3)", "–"])
                continue
            diff = "baseline" if s == base else "–"
            if base_fit is not None and s != base and at_heads is not None:
                d = stats.percent_difference(float(f(at_heads)), float(base_fit(at_heads)))
                ci = f"[{boot[s][0]:+.2f}%, {boot[s][1]:+.2f}%]" if s in boot else None
                diff = f"{d:+.2f}%" + (f" (95% CI {ci})" if ci else "")
                word = "lower (better)" if d < 0 else "higher (worse)"
                findings.append(f"At {at_heads:g} total heads the fitted {s} curve is {abs(d):.2f}% {word} than "
                                f"{base} ({float(f(at_heads)):.4f} vs {float(base_fit(at_heads)):.4f})"
                                + (f"; 95% bootstrap interval over seeds {ci}" if ci else "") + ".")
            rows.append([s, f"{f.a:.4f}", f"{f.b:.4f}", f"{f.c:.4g}", f.n_points,
                         fmt(float(f(at_heads)) if at_heads is not None else None), diff, f.note or "–"])
        if self.options.paper is not None and base is not None:
            findings.append(self.options.paper.sentence(base))
        doc.table(["series", "a", "b", "c", "points", f"fitted loss at {at_heads:g} heads" if at_heads else "fitted loss",
                   f"difference vs {base}" if base else "difference", "note"], rows)
        if seeds > 1:
            doc.add("The interval resamples each point's seeds with replacement (400 draws), refits both curves "
                    "and takes the 2.5th and 97.5th percentiles of the difference.")
        return findings

    def _significance(self, doc: Document) -> list[str]:
        """Each variant against the baseline series at the same values of the other axes."""
        if self.base is None or self.series is None:
            return []
        series = self.series
        by_key = {(self.series_of(v), series.group(v)): v for v in self.study.done}
        comps = []
        for v in self.study.done:
            ref = by_key.get((self.base, series.group(v)))
            if self.series_of(v) != self.base and ref is not None:
                comps.append((v, ref, stats.compare(v.name, v.losses, ref.name, ref.losses)))
        return comparison_table(doc, self.study.record.seeds, comps, f"the {self.base} variant at the same budget")
