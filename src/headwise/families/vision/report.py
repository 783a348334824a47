"""The ``vision`` layout (Leaner Transformers, Sec. 4.1: Figs. 2-4, Table 4): top-1 accuracy against
heads per layer at each depth (points labelled with parameters, the baseline dashed), against the
MLP ratio, the attention condition number over training, and Table 4 beside the paper's rows.

    [report]
    kind = "vision"
    baseline = "l12-h12-m4"                  # the original model (Fig. 3's dashed line)
    table = ["l12-h12-m4", "l7-h16-m2"]      # the headline rows of Table 4
    [report.paper]                           # source, table, dataset, rows = [{shape, top1, top5,
    ...                                      # params, memory_gb}], claim (what the findings test)

Accuracy is each run's last ``eval_metrics`` (``accuracy``; ``top5_accuracy`` above 10 classes),
in %. The heads grid is the variants at the baseline's MLP ratio, the MLP grid those at its heads
per layer; with several seeds, differences are Welch-tested with Holm's correction. A variant whose
heads or MLP widths vary over layers (a searched plan, ``headwise search``) is a row of the tables,
listed per layer, and a comparison with the baseline, but no point of the figures.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from headwise.errors import HeadwiseError
from headwise.presets import preset_dict
from headwise.report import stats
from headwise.report.accuracy import AccuracyLayout, acc_cell, draw_accuracy, finish_heads_panel, unscored_note, verdict
from headwise.report.accuracy import accuracy_values as _metric
from headwise.report.data import VariantRuns
from headwise.report.document import (Document, dodge, finish, fixed_ticks, fmt, fmt_p, fmt_params, heads_str,
                                      new_figure, plural)
from headwise.report.paper import BaselineOptions, PaperRow, PaperTable
from headwise.report.registry import register_layout
from headwise.report.sections import ALPHA, baseline_tables, memory_cell, params_cell, statuses


class VisionRow(PaperRow):
    """One image classifier of a published table: its top-1 (and top-5) accuracy."""

    top1: float
    top5: float | None = None


class VisionReference(PaperTable[VisionRow]):
    """A published table of image classifiers (e.g. Leaner Transformers' Table 4) and its claim."""

    dataset: str


class VisionOptions(BaselineOptions[VisionReference]):
    """The ``[report]`` keys of the vision layout."""


def _model(v: VariantRuns) -> dict[str, Any]:
    """The variant's model table, over its preset's fields."""
    model = v.info.config.get("model", {}) if v.info else {}
    try:
        fields = preset_dict(model["preset"]) if model.get("preset") else {}
    except HeadwiseError:
        fields = {}
    return {**fields, **model}


def mlp_widths(v: VariantRuns) -> list[int]:
    """The MLP's hidden width in each layer ([] when the config does not say)."""
    m = _model(v)
    hidden = m.get("mlp_hidden")
    if isinstance(hidden, list) and hidden:
        return [int(h) for h in hidden]
    d_model = v.d_model or m.get("d_model")
    if not isinstance(hidden, int) and not d_model:
        return []
    width = hidden if isinstance(hidden, int) else int(round(float(m.get("mlp_ratio", 4.0)) * d_model))
    return [width] * (v.n_layers or 1)


def mlp_hidden(v: VariantRuns) -> int | None:
    """The MLP's hidden width (the first layer's)."""
    return (mlp_widths(v) or [None])[0]


def same_shape(v: VariantRuns) -> bool:
    """Every layer alike (heads, head width and MLP width): a point of the paper's grids. A
    searched plan (``headwise search``) may vary them over layers; it is then a row of the tables
    and a comparison with the baseline, but no point of a figure drawn against one count."""
    return v.uniform and len(set(mlp_widths(v))) <= 1


@register_layout
class VisionLayout(AccuracyLayout):
    """Depth traded for heads in image classifiers: Leaner Transformers' Figs. 2-4 and Table 4."""

    kind = "vision"
    Options = VisionOptions
    conditioning_caption = ("heads per layer, one line per depth (at the baseline's MLP ratio; other shapes on "
                            "their own)")

    def setup(self) -> None:
        vs = self.study.variants
        self.by_name = {v.name: v for v in vs}
        self.base = self.by_name.get(self.options.baseline or "")
        self.top1 = {v.name: stats.seed_stats(_metric(v, "accuracy")) for v in vs}
        self.top5 = {v.name: stats.seed_stats(_metric(v, "top5_accuracy")) for v in vs}
        self.ratio = {v.name: round(mlp_hidden(v) / v.d_model, 4) if mlp_hidden(v) and v.d_model else None
                      for v in vs}
        self.scored = [v for v in self.study.done if self.top1[v.name].n]
        self.done = [v for v in self.scored if same_shape(v)]
        b = self.base if self.base in self.done else None
        common = Counter(self.ratio[v.name] for v in self.done).most_common(1)
        self.base_ratio = self.ratio[b.name] if b else (common[0][0] if common else None)
        common_h = Counter(v.heads[0] for v in self.done).most_common(1)
        self.base_heads = b.heads[0] if b else (common_h[0][0] if common_h else None)
        self.heads_grid = [v for v in self.done if self.ratio[v.name] == self.base_ratio]
        self.mlp_grid = [v for v in self.done if v.heads[0] == self.base_heads]
        self.depths = sorted({v.n_layers for v in self.heads_grid}, reverse=True)
        self.tests: list[stats.Comparison] = []  # the findings' tests, Holm-corrected together

    def group(self, v: VariantRuns) -> str:
        return f"{v.n_layers} layers" if v in self.heads_grid else v.name

    def _at(self, grid: list[VariantRuns], depth: int, key) -> list[VariantRuns]:
        return sorted((v for v in grid if v.n_layers == depth), key=key)

    def _test(self, a: VariantRuns, b: VariantRuns) -> stats.Comparison:
        c = self.compare(a, b)
        self.tests.append(c)
        return c

    def sections(self, doc: Document) -> list[str]:
        findings = self._table(doc)
        self._heads_figure(doc)
        self._mlp_figure(doc)
        findings += self._noise(doc)
        findings += self._conditioning_training(doc)
        return self._verdicts() + findings

    # ------------------------------------------------------------------ Table 4

    def _row(self, v: VariantRuns) -> list[str]:
        """A variant's row of Table 4, with its differences from the baseline."""
        b = self.base if self.base is not v else None
        top1 = acc_cell(self.top1[v.name], self.top1[b.name] if b is not None else None)
        widths = mlp_widths(v)
        return [f"`{v.name}`" + (" (baseline)" if self.base is v else ""), fmt(v.n_layers),
                fmt(v.heads[0]) if v.uniform else heads_str(v.heads),
                fmt(widths[0]) if len(set(widths)) == 1 else heads_str(widths), top1, acc_cell(self.top5[v.name]),
                params_cell(v, b), memory_cell(v, b), fmt(v.mean("tokens_per_s"), 0), statuses(v) or "not started"]

    def _table(self, doc: Document) -> list[str]:
        opts: VisionOptions = self.options
        headers = ["model", "depth", "heads", "MLP hidden", "top-1 %", "top-5 %", "parameters", "peak memory",
                   "images/s", "runs"]
        doc.add("## Table 4: depth for heads",
                "Leaner Transformers' Table 4 layout: top-1 and top-5 accuracy on the held-out images (mean ± sd "
                "over seeds; in parentheses the difference from the baseline in points), parameters, peak training "
                f"memory and training images per second, against the baseline `{opts.baseline}`. Top-5 is "
                "measured only above 10 classes (\"–\" otherwise).")
        names = baseline_tables(doc, opts, self.base, self.study, headers, self._row)
        unscored_note(doc, "Without", [v for v in self.study.variants if not self.top1[v.name].n])
        mixed = [v for v in self.scored if v not in self.done]
        if mixed:
            doc.add("Heads or MLP widths that vary over layers (listed per layer; compared with the baseline below, "
                    "but not drawn against one heads count or MLP ratio): "
                    + ", ".join(f"`{v.name}`" for v in mixed) + ".")
        p = opts.paper
        if p is None:
            return []
        doc.add(f"{p.citation} ({p.dataset}), quoted as published"
                + (f"; {p.caveat}" if p.caveat else "") + ":")
        doc.table(["model (depth, heads)", "top-1 %", "top-5 %", "parameters", "training memory"],
                  [[r.shape, f"{r.top1:g}", "–" if r.top5 is None else f"{r.top5:g}", fmt_params(r.params),
                    f"{r.memory_gb:g} GB" if r.memory_gb else "–"] for r in p.rows])
        findings = []
        if len(p.rows) >= 2:
            r0, r1 = p.rows[0], p.rows[-1]
            text = (f"{p.citation}: {r1.shape} at {r1.top1:g}% top-1 against "
                    f"{r0.top1:g}% for {r0.shape} ({r1.top1 - r0.top1:+.1f} points) with "
                    f"{stats.percent_difference(r1.params, r0.params):+.0f}% parameters")
            if len(names) >= 2 and all(self.top1[n].n for n in (names[0], names[-1])):
                a, b = self.by_name[names[0]], self.by_name[names[-1]]
                text += (f"; here `{b.name}` at {self.acc(b):.2f}% against {self.acc(a):.2f}% for `{a.name}` "
                         f"({self.acc(b) - self.acc(a):+.2f} points)")
                if a.params and b.params:
                    text += f" with {stats.percent_difference(b.params, a.params):+.0f}% parameters"
            findings.append(text + ".")
        return findings

    # ------------------------------------------------------------------ figures

    def _point(self, v: VariantRuns) -> dict[str, Any]:
        s = self.top1[v.name]
        return dict(variant=v.name, n_layers=v.n_layers, heads_per_layer=v.heads[0], mlp_ratio=self.ratio[v.name],
                    mlp_hidden=mlp_hidden(v), params=v.params, top1_mean=s.mean, top1_sd=s.std, seeds=s.n)

    def _draw(self, ax: Any, vs: list[VariantRuns], x: list[float], color: str, label: str | None, side: int,
              rows: list[dict[str, Any]]) -> None:
        draw_accuracy(ax, vs, x, self.top1, color, label, side, rows, self._point)

    def _heads_figure(self, doc: Document) -> None:
        """Fig. 3: top-1 against heads per layer, one panel per depth; other shapes in a panel of their own."""
        others = [v for v in self.done if v not in self.heads_grid and v not in self.mlp_grid]
        panels = [*self.depths, *(["other"] if others else [])]
        if not panels:
            return
        fig, axes = new_figure(4.6 * len(panels), 4.4, ncols=len(panels), sharey=True)
        rows: list[dict[str, Any]] = []
        for k, depth in enumerate(panels):
            ax = axes[0, k]
            vs = others if depth == "other" else self._at(self.heads_grid, depth, self.heads_of)
            if depth == "other":
                for i, v in enumerate(vs):
                    self._draw(ax, [v], [v.heads[0]], f"C{(i + 2) % 10}", v.name, i, rows)
            else:
                self._draw(ax, vs, [v.heads[0] for v in vs], f"C{k}", None, k, rows)
            self.reference_line(ax, self.base, f"baseline {self.options.baseline}")
            finish_heads_panel(ax, [v.heads[0] for v in vs], "other shapes" if depth == "other" else
                               f"{depth} layers (MLP ratio {self.base_ratio:g})")
        axes[0, 0].set_ylabel("top-1 accuracy (%)")
        fig.suptitle("Top-1 accuracy vs heads per layer (labels: parameters)")
        doc.add("## Accuracy vs heads per layer, by depth")
        doc.figure("accuracy_vs_heads", fig, rows, "Top-1 accuracy against heads per layer (head_dim fixed), one "
                   "panel per depth, at the baseline's MLP ratio; each point labelled with its parameters"
                   + (", error bars one sd over seeds" if self.study.record.seeds > 1 else "")
                   + "; the dashed line is the baseline, as in the paper's Fig. 3.")
        for depth in self.depths:
            doc.add(self.heads_line(f"Top-1 % at {depth} layers", self._at(self.heads_grid, depth, self.heads_of)))

    def _mlp_figure(self, doc: Document) -> None:
        """Fig. 4: top-1 against the MLP ratio, one line per depth, at the baseline's heads."""
        depths = sorted({v.n_layers for v in self.mlp_grid}, reverse=True)
        if not any(len({self.ratio[v.name] for v in self.mlp_grid if v.n_layers == d}) > 1 for d in depths):
            return
        fig, axes = new_figure(7.5, 4.6)
        ax, rows = axes[0, 0], []
        ratios = [self.ratio[v.name] or 0 for v in self.mlp_grid]
        span = (max(ratios) - min(ratios)) or 1
        for i, depth in enumerate(depths):
            vs = self._at(self.mlp_grid, depth, lambda v: self.ratio[v.name] or 0)
            # depths at one ratio side by side
            x = dodge([self.ratio[v.name] or 0 for v in vs], i, len(depths), span)
            self._draw(ax, vs, x, f"C{i}", f"{depth} layers", i, rows)
        self.reference_line(ax, self.base, f"baseline {self.options.baseline}")
        fixed_ticks(ax, [r["mlp_ratio"] for r in rows])
        finish(ax, "MLP ratio (hidden width / d_model)", "top-1 accuracy (%)",
               f"Top-1 accuracy vs MLP ratio at {self.base_heads} heads per layer (labels: parameters)")
        doc.add("## Accuracy vs MLP ratio")
        doc.figure("accuracy_vs_mlp", fig, rows, "Top-1 accuracy against the MLP ratio, one line per depth, at the "
                   "baseline's heads per layer; the dashed line is the baseline, as in the paper's Fig. 4.")

    def _noise(self, doc: Document) -> list[str]:
        """Each variant against the baseline: difference in points, Welch's test, Holm's correction."""
        comps = self.against(self.scored, self.base)
        if self.base is None or not comps:
            return []
        doc.add("## Differences from the baseline and seed noise",
                f"Each variant's top-1 against `{self.base.name}`, in points (positive = more accurate), with Welch's "
                "unequal-variance t-test across seeds (two-sided) and Holm's correction over the "
                f"{len(comps)} comparisons; distinguishable means Holm-adjusted p < {ALPHA}.")
        return [self.noise_report(doc, comps)[0]]

    def _conditioning_training(self, doc: Document) -> list[str]:
        """Fig. 2 over training: cond_mean logged by the trainer against epoch, one line per heads count."""
        def curve(v: VariantRuns) -> tuple[VariantRuns, list[float], list[float]]:
            per: dict[float, list[float]] = defaultdict(list)  # epoch -> each seed's cond_mean
            for m in (m for run in v.done for m in run.metrics()):
                c, e = m.get("cond_mean"), m.get("epoch")
                if isinstance(c, (int, float)) and math.isfinite(c) and isinstance(e, (int, float)):
                    per[float(e)].append(float(c))
            xs = sorted(e for e, vals in per.items() if len(vals) == len(v.done))
            return v, xs, [float(np.mean(per[e])) for e in xs]

        panels = [(d, [c for c in map(curve, self._at(self.heads_grid, d, self.heads_of)) if c[1]])
                  for d in self.depths]
        panels = [(d, lines) for d, lines in panels if lines]
        if not panels:
            return []
        fig, axes = new_figure(5.2 * len(panels), 4.2, ncols=len(panels), sharey=True)
        rows, findings = [], []
        for k, (depth, lines) in enumerate(panels):
            ax = axes[0, k]
            for i, (v, xs, ys) in enumerate(lines):
                ax.plot(xs, ys, marker=".", color=f"C{i % 10}", label=plural(v.heads[0], "head"))
                rows += [dict(variant=v.name, n_layers=depth, heads_per_layer=v.heads[0], epoch=x, cond_mean=y)
                         for x, y in zip(xs, ys)]
            ax.set_yscale("log")
            ax.set_title(f"{depth} layers", fontsize=10)
            finish(ax, "epoch", legend=7)
            if len(lines) >= 2:
                h = [v.heads[0] for v, _, _ in lines]
                last = [ys[-1] for _, _, ys in lines]
                falls = all(b < a for a, b in zip(last, last[1:]))
                findings.append(
                    f"Condition number at the last logged step, {depth} layers: " + ", ".join(
                        f"{plural(x, 'head')} {y:.3g}" for x, y in zip(h, last))
                    + (" (falls with every added head, as the paper's Fig. 2)." if falls else
                       " (does not fall with every added head, unlike the paper's Fig. 2)."))
        axes[0, 0].set_ylabel("condition number of A (mean over layers)")
        fig.suptitle("Attention-output conditioning during training")
        doc.add("## Conditioning during training")
        doc.figure("conditioning_training", fig, rows, "Mean condition number of the attention output over "
                   "layers, as the trainer logged it every `analysis.every` steps (`cond_mean`), against epoch, one "
                   "line per heads count and one panel per depth (log scale), as the paper's Fig. 2.")
        return findings

    # ------------------------------------------------------------------ findings

    def _verdict(self, c: stats.Comparison | None, holds: bool, heads: stats.Comparison | None = None) -> str:
        """'reproduced', 'not reproduced' or 'within noise' from a test (or, with one seed, the sign).
        With ``heads`` (the heads effect's test), ``c`` is the MLP effect's: the claim that it matters
        less holds when the heads effect is real and larger, or the MLP's is noise and the heads' is not."""
        if heads is not None and c is not None and c.testable and heads.testable:
            ps = f"Welch p = {fmt_p(heads.p_holm)} for heads, {fmt_p(c.p_holm)} for the MLP ratio, Holm-corrected"
            if heads.p_holm >= ALPHA and c.p_holm >= ALPHA:
                return f"within noise ({ps})"
            real = (holds and heads.p_holm < ALPHA) or (c.p_holm >= ALPHA and heads.p_holm < ALPHA)
            return ("reproduced" if real else "not reproduced") + f" ({ps})"
        return verdict(c, holds)

    def _verdicts(self) -> list[str]:
        parts: list[tuple[str, Any]] = []  # (text, test), verdicts filled after Holm's correction
        spans: dict[int, float] = {}
        heads_test: dict[int, stats.Comparison] = {}
        for depth in self.depths:
            vs = self._at(self.heads_grid, depth, self.heads_of)
            if len(vs) < 2:
                continue
            spans[depth] = max(map(self.acc, vs)) - min(map(self.acc, vs))
            text, rises = self.heads_trend(f"Accuracy vs heads at {depth} layers", vs)
            heads_test[depth] = self._test(vs[-1], vs[0])
            parts.append((text, (heads_test[depth], rises)))
        base = self.base if self.base in self.done else None
        if base is not None:
            fewer = [v for v in self.done if v.n_layers < base.n_layers and v.heads[0] > base.heads[0]
                     and v.params and base.params and v.params < base.params]
            if fewer:
                best = max(fewer, key=self.acc)
                above = [v for v in fewer if self.acc(v) >= self.acc(base)]
                parts.append((f"Reduced depth with more heads: {len(above)} of {len(fewer)} such variants reach the "
                              f"baseline's {self.acc(base):.2f}%; the best, `{best.name}`, {self.acc(best):.2f}% "
                              f"({self.acc(best) - self.acc(base):+.2f} points) with "
                              f"{stats.percent_difference(best.params, base.params):+.0f}% parameters: ",
                              (self._test(best, base), self.acc(best) > self.acc(base))))
            else:
                parts.append(("Reduced depth with more heads: no completed variant has fewer layers, more heads and "
                              "fewer parameters than the baseline, so this part of the claim is untested.", None))
        for depth, span in spans.items():
            vs = self._at(self.mlp_grid, depth, lambda v: self.ratio[v.name] or 0)
            if len(vs) < 2:
                continue
            lo, hi = min(vs, key=self.acc), max(vs, key=self.acc)
            mspan = self.acc(hi) - self.acc(lo)
            ratios = ", ".join(f"{self.ratio[v.name]:g}" for v in vs)
            parts.append((f"MLP ratio vs heads at {depth} layers: the MLP ratio ({ratios}) moves top-1 by {mspan:.2f} "
                          f"points, heads by {span:.2f}: ", (self._test(hi, lo), mspan < span, heads_test[depth])))
        stats.apply_holm(self.tests)
        out = [text if test is None else text + self._verdict(*test) + "." for text, test in parts]
        return self.with_claim(out)
