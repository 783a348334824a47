"""The ``timm-tables`` layout (Leaner Transformers' Tables 4-5, on timm): each architecture's
reduced model (fewer layers, more heads) against its original, their top-1 accuracy and parameters
and the paired difference over seeds, beside the paper's rows of the matching presets
(:mod:`headwise.families.vision.timm_presets`), and accuracy against parameters with an arrow from
each original to its reduced model.

    [report]
    kind = "timm-tables"
    pairs = [["deit-b-reduced", "deit-b"], ["xcit-m-reduced", "xcit-m"]]   # [reduced, original]

A variant's paper row is that of the preset named ``timm-`` and the variant's name (``deit-b`` ->
``timm-deit-b``); a variant without one shows none, saying so. The paired difference is the reduced
model's top-1 less the original's at each seed both completed (a seed fixes both runs' data order),
with its 95% t interval (:func:`headwise.report.paired.paired_gain`). Declared ``[[claims]]`` get
the verdict section every layout gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from headwise.errors import HeadwiseError
from headwise.families.vision.timm_presets import PRESETS, TimmPreset
from headwise.report import stats
from headwise.report.accuracy import AccuracyLayout, acc_cell, accuracy_values, unscored_note
from headwise.report.data import VariantRuns
from headwise.report.document import Document, finish, fmt_params, new_figure
from headwise.report.paired import PairedGain, paired_gain
from headwise.report.registry import LayoutOptions, register_layout
from headwise.study.layout import STUDY_TOML

#: the paper's scale (its Sec. 4.1.2 and Table 6), beside which ours is stated
PAPER_SCALE = ("ImageNet-1k (1,000 classes, 224 px), 300 epochs at batch 1,024 (512 for Table 5's large models) on "
               "8 A100s")


class TimmTablesOptions(LayoutOptions):
    """The ``[report]`` keys of the timm-tables layout."""

    #: ``[reduced, original]`` variant names, one pair per architecture
    pairs: list[tuple[str, str]] = Field(min_length=1)


def paper_preset(variant: str) -> TimmPreset | None:
    """The preset of Tables 4-5 a variant is named after (``deit-b`` -> ``timm-deit-b``), or None."""
    return next((p for p in PRESETS if p.name == f"timm-{variant}"), None)


@dataclass(frozen=True)
class PaperPair:
    """The paper's reduced and original rows: top-1 difference (points) and the reduced / original
    ratios of parameters and training memory."""

    reduced: TimmPreset
    original: TimmPreset

    @property
    def top1_difference(self) -> float:
        return float(self.reduced.paper_top1) - float(self.original.paper_top1)

    @property
    def params_ratio(self) -> float:
        return float(self.reduced.paper_params) / float(self.original.paper_params)

    @property
    def memory_ratio(self) -> float:
        return float(self.reduced.paper_memory_gb) / float(self.original.paper_memory_gb)


@dataclass(frozen=True)
class Pair:
    """One architecture of the study: its reduced and original variants, the reduced model's top-1
    gain at the seeds both completed, and the paper's rows where both have a preset."""

    reduced: VariantRuns
    original: VariantRuns
    gain: PairedGain
    paper: PaperPair | None

    @property
    def params_ratio(self) -> float | None:
        r, o = self.reduced.params, self.original.params
        return r / o if r and o else None


def _shape(v: VariantRuns) -> str:
    """(depth, heads) as the paper's rows print them; every layer's heads where they differ."""
    if not v.heads:
        return "–"
    return f"({v.n_layers}, {v.heads[0]})" if v.uniform else f"({v.n_layers}, [{', '.join(map(str, v.heads))}])"


def _by_seed(v: VariantRuns) -> dict[int, float]:
    """Seed -> top-1 (%) of the variant's completed runs."""
    return {run.seed: 100.0 * x for run in v.done if (x := run.final("accuracy")) is not None}


def _interval(g: PairedGain) -> str:
    return "–" if g.n < 2 else f"[{g.low:+.2f}, {g.high:+.2f}]"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


@register_layout
class TimmTablesLayout(AccuracyLayout):
    """Reduced against original timm models, architecture by architecture: Tables 4-5."""

    kind = "timm-tables"
    Options = TimmTablesOptions
    conditioning_caption = "heads per layer, one line per architecture (its original and reduced model)"

    def setup(self) -> None:
        by_name = {v.name: v for v in self.study.variants}
        missing = [n for pair in self.options.pairs for n in pair if n not in by_name]
        if missing:
            raise HeadwiseError(f"{self.study.record.path / STUDY_TOML}: [report] pairs names variant {missing[0]!r}, "
                                f"which the study does not have (variants: {', '.join(by_name)}); correct its "
                                "[report] pairs")
        self.top1 = {v.name: stats.seed_stats(accuracy_values(v)) for v in self.study.variants}
        self.top5 = {v.name: stats.seed_stats(accuracy_values(v, "top5_accuracy")) for v in self.study.variants}
        self.arch = {name: o for r, o in self.options.pairs for name in (r, o)}
        self.pairs = []
        for r, o in self.options.pairs:
            presets = paper_preset(r), paper_preset(o)
            gain = paired_gain(_by_seed(by_name[r]), _by_seed(by_name[o]), higher_is_better=True)
            self.pairs.append(Pair(by_name[r], by_name[o], gain, PaperPair(*presets) if all(presets) else None))
        #: each pair's original and reduced variant, in the order of the pairs
        self.paired = [v for p in self.pairs for v in (p.original, p.reduced)]

    def group(self, v: VariantRuns) -> str:
        # an architecture's two models together; a variant in no pair on its own
        return self.arch.get(v.name, v.name)

    def panel(self, v: VariantRuns) -> str:
        return self.group(v)

    def sections(self, doc: Document) -> list[str]:
        findings = self._tables(doc)
        self._figure(doc)
        return findings

    # ------------------------------------------------------------------ tables

    def _paper_size(self) -> bool:
        """Whether every paired variant with a parameter count is its preset's model, at its count."""
        counted = [(v, paper_preset(v.name)) for v in self.paired if v.params]
        return bool(counted) and all(p is not None and v.params == p.params for v, p in counted)

    def _scale(self) -> str:
        """Ours (from the first completed run of a pair) beside the paper's."""
        run = next((r for v in self.paired for r in v.done), None)
        s = run.summary if run is not None else None
        ours = (f"{run.task.setup_line(s.task)}, {s.steps} steps of {s.tokens_per_step} {s.unit} on {s.device}"
                if s is not None and run.task is not None else "unread (no completed run)")
        if self._paper_size():
            return f"Scale: here {ours}, with the paper's models (its presets' counts); the paper: {PAPER_SCALE}."
        return (f"Scale: here {ours}, with models scaled down (their parameters against the paper's below); the "
                f"paper: {PAPER_SCALE}. What carries over is the direction of each change, not its size.")

    def _variant_row(self, v: VariantRuns) -> list[str]:
        p = paper_preset(v.name)
        paper = ([f"`{p.name}`: {p.row}", p.paper_top1, p.paper_top5, f"{p.paper_params}M", f"{p.paper_memory_gb} GB"]
                 if p is not None else [f"none (no preset `timm-{v.name}`)", "–", "–", "–", "–"])
        return [f"`{self.arch[v.name]}`", f"`{v.name}`", _shape(v), acc_cell(self.top1[v.name]),
                acc_cell(self.top5[v.name]), fmt_params(v.params), *paper]

    def _pair_row(self, p: Pair) -> list[str]:
        g, pp = p.gain, p.paper
        paper = ([f"{pp.top1_difference:+.1f}", _ratio(pp.params_ratio), _ratio(pp.memory_ratio)] if pp is not None
                 else ["no paper row", "–", "–"])
        return [f"`{p.reduced.name}` / `{p.original.name}`", str(g.n), f"{g.mean:+.2f}" if g.n else "–", _interval(g),
                _ratio(p.params_ratio), *paper]

    def _tables(self, doc: Document) -> list[str]:
        doc.add("## Tables 4-5: reduced against original, beside the paper",
                "Leaner Transformers' Tables 4-5 layout: each architecture's original and reduced (fewer layers, more "
                "heads) model, top-1 and top-5 accuracy on the held-out images (mean ± sd over seeds; top-5 only "
                "above 10 classes) and parameters, beside "
                "the paper's row of the matching preset (`headwise.families.vision.timm_presets`), quoted as "
                "published. " + self._scale())
        doc.table(["architecture", "variant", "(depth, heads)", "top-1 %", "top-5 %", "parameters", "paper's row",
                   "paper top-1 %", "paper top-5 %", "paper parameters", "paper training memory"],
                  [self._variant_row(v) for v in self.paired])
        doc.add("Reduced against original: the reduced model's top-1 less the original's at each seed both completed "
                "(in points), the mean and its 95% t interval over those paired seeds, and the reduced / original "
                "ratio of parameters; the paper's difference and ratios from its rows.")
        doc.table(["pair (reduced / original)", "paired seeds", "top-1 difference (points)", "95% interval",
                   "parameters ratio", "paper top-1 difference", "paper parameters ratio", "paper memory ratio"],
                  [self._pair_row(p) for p in self.pairs])
        if max(p.gain.n for p in self.pairs) == 1:
            doc.add("**With one paired seed per architecture there is no interval: the differences cannot be told from "
                    "seed noise; rerun with `--seeds 3` (or more).**")
        unscored_note(doc, "Without", [v for v in self.paired if not self.top1[v.name].n])
        doc.data("pairs", [self._csv_row(p) for p in self.pairs],
                 "Each pair's numbers, unrounded, with each seed's top-1 and difference.")
        return [self._finding(p) for p in self.pairs if p.gain.n]

    def _csv_row(self, p: Pair) -> dict[str, Any]:
        g, pp = p.gain, p.paper

        def per_seed(v: VariantRuns) -> str:
            return " ".join(f"{seed}:{acc!r}" for seed, acc in _by_seed(v).items())

        return dict(reduced=p.reduced.name, original=p.original.name, reduced_top1_mean=self.top1[p.reduced.name].mean,
                    original_top1_mean=self.top1[p.original.name].mean,
                    reduced_top1_per_seed=per_seed(p.reduced), original_top1_per_seed=per_seed(p.original),
                    paired_seeds=" ".join(map(str, g.seeds)), top1_difference=g.mean,
                    top1_difference_per_seed=" ".join(map(repr, g.gains)), interval_low=g.low, interval_high=g.high,
                    reduced_params=p.reduced.params, original_params=p.original.params, params_ratio=p.params_ratio,
                    paper_reduced=pp.reduced.name if pp else None, paper_original=pp.original.name if pp else None,
                    paper_top1_difference=pp.top1_difference if pp else None,
                    paper_params_ratio=pp.params_ratio if pp else None,
                    paper_memory_ratio=pp.memory_ratio if pp else None)

    def _finding(self, p: Pair) -> str:
        g, pp = p.gain, p.paper
        r, o = self.top1[p.reduced.name], self.top1[p.original.name]
        spread = (f", 95% interval {_interval(g)} over {g.n} paired seeds" if g.n > 1 else
                  ", one seed: no interval")
        text = (f"`{p.reduced.name}` against `{p.original.name}`: top-1 {r.mean:.2f}% vs {o.mean:.2f}% "
                f"({g.mean:+.2f} points{spread}) with {_ratio(p.params_ratio)} the parameters")
        if pp is None:
            return text + "; the paper has no row for this pair."
        return (text + f"; the paper's Table {pp.original.table}: {pp.reduced.paper_top1}% vs "
                f"{pp.original.paper_top1}% ({pp.top1_difference:+.1f} points) with {_ratio(pp.params_ratio)} the "
                f"parameters and {_ratio(pp.memory_ratio)} the training memory.")

    # ------------------------------------------------------------------ figure

    def _ours(self, v: VariantRuns) -> tuple[float, float, float] | None:
        s = self.top1[v.name]
        return (v.params / 1e6, s.mean, s.std if s.n > 1 else 0.0) if s.n and v.params else None

    def _figure(self, doc: Document) -> None:
        """Top-1 against parameters, an arrow from each original to its reduced model: here and in the paper."""
        fig, axes = new_figure(11.0, 4.6, ncols=2)
        rows: list[dict[str, Any]] = []
        for i, p in enumerate(self.pairs):
            ends = [self._ours(v) for v in (p.original, p.reduced)]
            if all(ends):
                _arrow(axes[0, 0], ends, f"C{i % 10}", p.original.name)
                rows += [dict(source="this study", architecture=p.original.name, variant=v.name, role=role,
                              params_m=e[0], top1=e[1], top1_sd=e[2] if self.top1[v.name].n > 1 else None,
                              seeds=self.top1[v.name].n)
                         for v, role, e in zip((p.original, p.reduced), ("original", "reduced"), ends)]
            if p.paper is not None:
                paper = [(float(t.paper_params), float(t.paper_top1), 0.0) for t in (p.paper.original, p.paper.reduced)]
                _arrow(axes[0, 1], paper, f"C{i % 10}", p.original.name)
                rows += [dict(source="paper", architecture=p.original.name, variant=t.name, role=role, params_m=e[0],
                              top1=e[1], top1_sd=None, seeds=None)
                         for t, role, e in zip((p.paper.original, p.paper.reduced), ("original", "reduced"), paper)]
        if not rows:
            return
        for ax, title in zip(axes[0], ("This study", "The paper (ImageNet-1k)")):
            finish(ax, "parameters (millions)", "top-1 accuracy (%)", title,
                   legend=7 if ax.get_legend_handles_labels()[0] else None)
        fig.suptitle("Top-1 accuracy vs parameters: original -> reduced (fewer layers, more heads)")
        doc.add("## Accuracy vs parameters")
        doc.figure("accuracy_vs_params", fig, rows, "Top-1 accuracy against parameters, an arrow from each "
                   "architecture's original model (circle) to its reduced one (square), here (error bars one sd over "
                   "seeds where there are several) and in the paper's Tables 4-5; up and to the left is the paper's "
                   "claim.")


def _arrow(ax: Any, ends: list[Any], color: str, label: str) -> None:
    """An original (circle) and its reduced model (square), ``(params, top-1, sd)`` each, joined
    by an arrow from the first to the second."""
    (x0, y0, e0), (x1, y1, e1) = ends
    ax.errorbar([x0], [y0], yerr=[e0] if e0 else None, marker="o", color=color, capsize=3, ls="none", label=label)
    ax.errorbar([x1], [y1], yerr=[e1] if e1 else None, marker="s", color=color, capsize=3, ls="none")
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color=color, lw=1.3))
    ax.margins(0.15)  # room for the error bars of the outermost points
