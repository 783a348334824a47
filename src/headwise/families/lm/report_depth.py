"""The ``depth`` layout (Leaner Transformers: More Heads, Less Depth): Table 2 (loss, parameters
and peak memory against the baseline), loss against heads per layer for each depth, and loss
against parameters.

    [report]
    kind = "depth"
    baseline = "l12-h12-hd8"              # the variant the others are compared against
    table = ["l12-h12-hd8", "l4-h16-hd8"] # the headline table's variants (default: all)

    [report.paper]                        # the paper's own Table 2, quoted beside the study's
    source = "the paper"
    table = "Table 2"
    dataset = "TinyStories"
    caveat = "it does not say whether d_model or head_dim was held fixed, so both are shown"
    baseline = { shape = "GPT-2 12 x 12", loss = 2.47, params = 89e6, memory_gb = 12.8 }
    model = { shape = "4 x 16", loss = 2.41, params = 64e6, memory_gb = 9.7 }

The headline table's numbers go to ``headline_table.csv`` beside it; where the listed variants'
KV caches differ, or one shares its KV heads (grouped-query attention: the ``kv-heads`` study), the
table adds each variant's KV heads per layer and KV-cache bytes per token (:mod:`.report_kv`).

Depth is the number of layers of each run's plan. The grid is the variants with the same heads
and head_dim in every layer, at the baseline's head_dim; the others are drawn on their own.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import Field

from headwise.families.lm.report_kv import KVColumns
from headwise.report import stats
from headwise.report.data import VariantRuns
from headwise.report.document import Document, dodge, finish, fixed_ticks, fmt_params, label_points, new_figure
from headwise.report.paper import BaselineOptions, PaperRow
from headwise.report.registry import Layout, PaperReference, register_layout
from headwise.report.sections import (comparison_table, cpu_memory_note, memory_cell, missing_baseline_note,
                                      params_cell, seed_cell)


def heads_per_layer(v: VariantRuns) -> float:
    """A variant's heads per layer: its count where every layer has it, else the mean (a per-layer
    plan sits at its average, so plans of one total share an x)."""
    return v.heads[0] if v.uniform else sum(v.heads) / len(v.heads)


def _spliced(row: list[str], kv: list[str], shown: bool) -> list[str]:
    """A headline row (model, shape, loss, parameters, memory) with the two KV cells where shown:
    the KV heads beside the shape, the cache beside the parameters (the study's two budgets)."""
    return row[:2] + kv[:1] + row[2:4] + kv[1:] + row[4:] if shown else row


class PaperModel(PaperRow):
    """One model of a published table, with its loss and (required here) its training memory."""

    loss: float
    memory_gb: float = Field(gt=0)


class TableReference(PaperReference):
    """A published model against its baseline (e.g. Leaner Transformers' Table 2)."""

    dataset: str
    baseline: PaperModel
    model: PaperModel

    def _deltas(self) -> tuple[float, float]:
        b, m = self.baseline, self.model
        return stats.percent_difference(m.params, b.params), stats.percent_difference(m.memory_gb, b.memory_gb)

    def reports(self) -> str:
        """What the publication reports, for the section's introduction."""
        b, m = self.baseline, self.model
        dp, dm = self._deltas()
        caveat = f"; {self.caveat}" if self.caveat else ""
        return (f"{self.source[:1].upper()}{self.source[1:]} reports {b.shape} at {b.loss:g} / {b.params / 1e6:g}M / "
                f"{b.memory_gb:g} GB against {m.shape} at {m.loss:g} / {m.params / 1e6:g}M ({dp:+.0f}%) / "
                f"{m.memory_gb:g} GB ({dm:+.0f}%) on {self.dataset}{caveat}.")

    def finding(self) -> str:
        """The comparison as one finding."""
        b, m = self.baseline, self.model
        dp, dm = self._deltas()
        return (f"For comparison, {self.source}'s {self.table}: {m.shape} at val. loss {m.loss:g} against "
                f"{b.loss:g} for {b.shape}, with {dp:+.0f}% parameters and {dm:+.0f}% training memory.")


class DepthOptions(BaselineOptions[TableReference]):
    """The ``[report]`` keys of the depth layout (its headline table: every variant when ``table`` is None)."""


@register_layout
class DepthLayout(Layout):
    """Depth traded for heads: the headline table against the baseline, and the grid of depth x
    heads per layer."""

    kind = "depth"
    Options = DepthOptions
    conditioning_label = "heads per layer"
    conditioning_caption = "heads per layer, one line per depth"

    def setup(self) -> None:
        self.by_name = {v.name: v for v in self.study.variants}
        self.base = self.by_name.get(self.options.baseline or "")
        uniform = [v for v in self.study.done if v.uniform and v.head_dims]
        if self.base is not None and self.base.uniform and self.base.head_dims:
            grid_dim = self.base.head_dims[0]
        else:  # no baseline shape to go by: the most common head_dim
            grid_dim = Counter(v.head_dims[0] for v in uniform).most_common(1)[0][0] if uniform else None
        self.grid = [v for v in uniform if v.head_dims[0] == grid_dim]

    def group(self, v: VariantRuns) -> str:
        # the grid by depth; variants outside it on their own
        return f"{v.n_layers} layers" if v in self.grid else v.name

    def conditioning_x(self, v: VariantRuns) -> float:
        return float(heads_per_layer(v))

    def sections(self, doc: Document) -> list[str]:
        findings = self._table(doc)
        self._by_depth_figure(doc)
        self._params_figure(doc)
        base = self.base
        if base is not None and base.done:
            names = self.options.table or [v.name for v in self.study.variants]
            comps = [(v, base, stats.compare(v.name, v.losses, base.name, base.losses))
                     for v in self.study.done if v is not base and v.name in names]
            findings += comparison_table(doc, self.study.record.seeds, comps, f"the baseline `{base.name}`",
                                         summarize=False)
        return findings

    def _shape(self, v: VariantRuns) -> str:
        if v.heads and not v.uniform:  # a per-layer plan (a scheme, a searched plan): every layer
            return (f"{v.n_layers} layers, heads {','.join(map(str, v.heads))}, "
                    f"head_dim {','.join(map(str, v.head_dims)) if v.head_dims else '?'}")
        return (f"{v.n_layers} layers x {v.heads[0] if v.heads else '?'} heads, "
                f"head_dim {v.head_dims[0] if v.head_dims else '?'}")

    def _table(self, doc: Document) -> list[str]:
        """Table 2: each listed variant's loss, parameters and peak memory against the baseline, with
        its KV heads and KV-cache bytes per token where they tell something (:mod:`.report_kv`)."""
        opts: DepthOptions = self.options
        listed = [self.by_name[name] for name in opts.table or list(self.by_name) if name in self.by_name]
        # the baseline's precision picks the cache dtype, so it leads wherever the table lists it
        kv = KVColumns.of(sorted(listed, key=lambda v: v is not self.base))
        doc.add("## Table 2: depth for heads",
                "Leaner Transformers' Table 2 layout: validation loss, parameters"
                + (", KV-cache bytes per token" if kv.shown else "") + " and peak training memory, each "
                f"against the baseline `{opts.baseline}`." + (f" {opts.paper.reports()}" if opts.paper else ""))
        missing_baseline_note(doc, opts.baseline, self.base)
        rows, findings = [], []
        for v in listed:
            row, finding = self._versus_base(v, kv)
            rows.append(row)
            findings += [finding] if finding else []
        if findings and opts.paper is not None:
            findings.append(opts.paper.finding())
        doc.table(_spliced(["model", "shape", "val. loss", "parameters", "peak memory"], kv.headers, kv.shown), rows)
        if kv.shown:
            doc.add(kv.note())
        cpu_memory_note(doc, self.base.info if self.base is not None else None)
        doc.data("headline_table", [self._csv_row(v, kv) for v in listed],
                 "The table's numbers, unrounded (KV-cache bytes in every recorded dtype; empty where not recorded).")
        return findings

    def _versus_base(self, v: VariantRuns, kv: KVColumns) -> tuple[list[str], str | None]:
        """A variant's row of Table 2 (with its differences from the baseline) and its finding."""
        base, pct = self.base, stats.percent_difference
        # differences only from another baseline, and only where both count their parameters
        b = base if base is not None and v is not base and base.params and v.params else None
        dl = pct(v.stats.mean, b.stats.mean) if b is not None and v.done and b.done else None
        row = _spliced([f"`{v.name}`" + (" (baseline)" if v is base else ""), self._shape(v),
                        seed_cell(v.stats) + (f" ({dl:+.2f}%)" if dl is not None else ""), params_cell(v, b),
                        memory_cell(v, b)], kv.cells(v, base), kv.shown)
        if b is None or dl is None:
            return row, None
        dk = kv.difference(v, b) if kv.shown else None
        budgets = [f"{pct(v.params, b.params):+.0f}% parameters"]
        budgets += [f"{dk:+.0f}% KV-cache bytes per token"] if dk is not None else []
        budgets += [f"{pct(v.peak_mb, b.peak_mb):+.0f}% peak memory"] if v.peak_mb and b.peak_mb else []
        listed = ", ".join(budgets[:-1]) + " and " + budgets[-1] if len(budgets) > 1 else budgets[0]
        return row, (f"`{v.name}` ({self._shape(v)}): eval loss {v.stats.mean:.4f} vs {b.stats.mean:.4f} for the "
                     f"baseline ({'lower' if v.stats.mean < b.stats.mean else 'higher'}, {dl:+.2f}%), with {listed}.")

    def _csv_row(self, v: VariantRuns, kv: KVColumns) -> dict[str, Any]:
        """A variant's row of the table's CSV: the markdown's numbers, unrounded."""
        base, pct = self.base, stats.percent_difference
        other = base is not None and v is not base

        def versus(mine: float | None, theirs: float | None) -> float | None:
            return pct(mine, theirs) if other and mine is not None and theirs else None

        return dict(variant=v.name, baseline=v is base, n_layers=v.n_layers, heads=" ".join(map(str, v.heads)),
                    head_dims=" ".join(map(str, v.head_dims)), loss_mean=v.stats.mean if v.done else None,
                    loss_sd=v.stats.std if v.stats.n > 1 else None, seeds=v.stats.n,
                    loss_vs_baseline_pct=versus(v.stats.mean if v.done else None,
                                                base.stats.mean if base is not None and base.done else None),
                    params=v.params, params_vs_baseline_pct=versus(v.params, base.params if base else None),
                    peak_memory_mib=v.peak_mb,
                    peak_memory_vs_baseline_pct=versus(v.peak_mb, base.peak_mb if base else None),
                    **kv.csv_fields(v, base))

    def _point_row(self, v: VariantRuns) -> dict[str, Any]:
        return dict(variant=v.name, n_layers=v.n_layers, heads_per_layer=heads_per_layer(v),
                    head_dim=v.head_dims[0] if v.uniform else " ".join(map(str, v.head_dims)),
                    params=v.params, loss_mean=v.stats.mean, loss_sd=v.stats.std, seeds=v.stats.n)

    def _by_depth_figure(self, doc: Document) -> None:
        """Loss against heads per layer, one line per depth of the grid; the rest as markers."""
        fig, axes = new_figure(8.0, 5.0)
        ax = axes[0, 0]
        rows: list[dict[str, Any]] = []
        depths = sorted({v.n_layers for v in self.grid})
        heads = [v.heads[0] for v in self.grid]
        span = (max(heads) - min(heads)) or 1 if heads else 1
        for i, depth in enumerate(depths):
            vs = sorted((v for v in self.grid if v.n_layers == depth), key=lambda v: v.heads[0])
            drawn = dodge([v.heads[0] for v in vs], i, len(depths), span)  # depths at one head count side by side
            ax.errorbar(drawn, [v.stats.mean for v in vs],
                        yerr=[v.stats.std if v.stats.n > 1 else 0.0 for v in vs] if self.study.record.seeds > 1
                        else None, marker="o", color=f"C{i}", capsize=3, label=f"{depth} layers")
            label_points(ax, drawn, [v.stats.mean for v in vs], [fmt_params(v.params) for v in vs], f"C{i}", i)
            rows += [self._point_row(v) for v in vs]
        markers = iter("*DPXv^<>")
        for v in (v for v in self.study.done if v not in self.grid):
            ax.scatter([heads_per_layer(v)], [v.stats.mean], marker=next(markers, "s"), s=90, color="k", zorder=4,
                       label=f"{v.name} ({fmt_params(v.params)}" + ("" if v.uniform else
                                                                     f", heads {','.join(map(str, v.heads))}") + ")")
            rows.append(self._point_row(v))
        if self.base is not None and self.base.done:
            ax.axhline(self.base.stats.mean, color="0.4", ls=":", lw=1, label=f"baseline {self.base.name}")
        fixed_ticks(ax, [r["heads_per_layer"] for r in rows])
        finish(ax, "heads per layer", "final eval loss",
               "Final eval loss vs heads per layer, by depth (labels: parameters)")
        doc.add("## Loss vs heads per layer, by depth")
        doc.figure("loss_vs_heads_by_depth", fig, rows, "Final eval loss against heads per layer, one line per depth "
                   "(the grid, at fixed head_dim); black markers are the other variants; the dotted line is the "
                   "baseline, as in the paper's Figs. 3 and 5.")

    def _params_figure(self, doc: Document) -> None:
        """Loss against parameters, one colour per depth."""
        fig, axes = new_figure(8.0, 5.0)
        ax = axes[0, 0]
        rows = []
        for i, depth in enumerate(sorted({v.n_layers for v in self.study.done})):
            vs = [v for v in self.study.done if v.n_layers == depth]
            ax.scatter([v.params / 1e6 for v in vs], [v.stats.mean for v in vs], color=f"C{i}", label=f"{depth} layers")
            for v in vs:
                ax.annotate(f"{heads_per_layer(v):g}h" + ("" if v in self.grid else f" {v.name}"),
                            (v.params / 1e6, v.stats.mean),
                            textcoords="offset points", xytext=(4, 3), fontsize=7)
                rows.append(dict(variant=v.name, n_layers=depth, heads_per_layer=heads_per_layer(v), params=v.params,
                                 loss_mean=v.stats.mean))
        finish(ax, "parameters (millions)", "final eval loss",
               "Final eval loss vs parameters (labels: heads per layer)")
        doc.figure("loss_vs_params", fig, rows, "Final eval loss against parameters: trading depth for heads moves "
                   "left (fewer parameters); lower is better.")
