"""The ``encoder`` layout (Leaner Transformers, Sec. 4.2, Table 1): each variant's fine-tuned scores
per task, their mean (the GLUE score when the stages are Table 1's eight tasks), the pretraining
loss, parameters and peak memory, beside the paper's rows.

    [report]
    kind = "encoder"
    baseline = "l16-h12"                       # the original model
    table = ["l16-h12", "l10-h24"]             # the headline rows of Table 1
    [report.paper]                             # source, table, pretraining, rows = [{shape, scores
    ...                                        # = {MNLI = 83.8, ...}, glue, params, memory_gb}], claim

The scores come from the study's ``[[stages]]`` (:mod:`headwise.study.stages`): one fine-tuning
stage per task, each run from its variant's pretraining run of the same seed. A GLUE task is
scored by its Table 1 metric (:data:`~headwise.families.encoder.metrics.TABLE1_COLUMNS`), the
offline stand-in by its accuracy; all in points (x 100). A seed's mean is taken over the tasks that
seed completed all of; parameters and memory are the pretraining runs' (the encoder with its tied
decoder, as the paper counts them).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from headwise.families.encoder.metrics import TABLE1_COLUMNS
from headwise.report import stats
from headwise.report.accuracy import acc_cell, draw_accuracy
from headwise.report.data import VariantRuns, load_study_runs
from headwise.report.document import Document, fixed_ticks, fmt, fmt_params, new_figure
from headwise.report.paper import BaselineOptions, PaperRow, PaperTable
from headwise.report.registry import Layout, register_layout
from headwise.report.sections import baseline_tables, memory_cell, params_cell, statuses
from headwise.study.stages import Stage, saved_stages, stage_record

#: Table 1's column and metric of each GLUE task
COLUMN = {task: (column, metric) for column, task, metric in TABLE1_COLUMNS}


class GlueRow(PaperRow):
    """One encoder of a published GLUE table: its score per task and their mean."""

    #: column name (MNLI, SST-2, ...) -> score in points
    scores: dict[str, float] = Field(min_length=1)
    glue: float


class EncoderReference(PaperTable[GlueRow]):
    """A published table of encoders fine-tuned on GLUE (Leaner Transformers' Table 1) and its claim."""

    #: how the published models were pretrained
    pretraining: str


class EncoderOptions(BaselineOptions[EncoderReference]):
    """The ``[report]`` keys of the encoder layout."""


def stage_column(stage: Stage) -> tuple[str, str]:
    """A stage's column name and the metric it is scored by: Table 1's for a GLUE task, accuracy
    for the stand-in (and any other classification)."""
    task = str(stage.config.get("task", {}).get("task", ""))
    return COLUMN.get(task, (stage.name, "accuracy"))


def seed_scores(v: VariantRuns, metric: str) -> dict[int, float]:
    """Seed -> the metric of the variant's completed run, in points."""
    return {r.seed: 100.0 * value for r in v.runs if (value := r.final(metric)) is not None}


@register_layout
class EncoderLayout(Layout):
    """Depth traded for heads in pretrained encoders: Leaner Transformers' Table 1."""

    kind = "encoder"
    Options = EncoderOptions
    conditioning_label = "heads per layer"
    conditioning_caption = "heads per layer (pretrained encoders)"

    def setup(self) -> None:
        self.by_name = {v.name: v for v in self.study.variants}
        self.base = self.by_name.get(self.options.baseline or "")
        self.stages = saved_stages(self.study.record)
        # stage -> variant -> its runs of that stage
        runs: dict[str, dict[str, VariantRuns]] = {
            s.name: {x.name: x for x in load_study_runs(stage_record(self.study.record, s.name)).variants}
            for s in self.stages}
        # variant -> stage -> seed -> score (points)
        self.scores: dict[str, dict[str, dict[int, float]]] = {
            v.name: {s.name: seed_scores(runs[s.name][v.name], stage_column(s)[1]) for s in self.stages}
            for v in self.study.variants}
        self.task_stats = {v: {s: stats.seed_stats(list(by_seed.values())) for s, by_seed in per.items()}
                           for v, per in self.scores.items()}
        self.stage_status = {v.name: {s.name: statuses(runs[s.name][v.name]) for s in self.stages}
                             for v in self.study.variants}
        self.mean = {v: self._mean_over_tasks(per) for v, per in self.scores.items()}
        columns = [stage_column(s)[0] for s in self.stages]
        if sorted(columns) == sorted(c for c, _, _ in TABLE1_COLUMNS):
            self.mean_label = "GLUE"
        else:
            self.mean_label = columns[0] if len(columns) == 1 else "mean"
        # one task: its column is the mean already
        self.mean_column = len(self.stages) > 1

    def group(self, v: VariantRuns) -> str:
        return f"{v.n_layers} layers"

    def conditioning_x(self, v: VariantRuns) -> float:
        return float(v.heads[0]) if v.heads else 0.0

    def _mean_over_tasks(self, per: dict[str, dict[int, float]]) -> stats.SeedStats:
        """A variant's mean over tasks, per seed that completed every task."""
        seeds = set.intersection(*(set(by_seed) for by_seed in per.values())) if per else set()
        return stats.seed_stats([float(np.mean([by_seed[k] for by_seed in per.values()])) for k in sorted(seeds)])

    def sections(self, doc: Document) -> list[str]:
        findings = self._table(doc)
        self._figure(doc)
        findings += self._paper(doc)
        return findings

    def _row(self, v: VariantRuns) -> list[str]:
        cells = [acc_cell(self.task_stats[v.name][s.name]) for s in self.stages]
        b = self.base if self.base is not v else None
        mean_cell = acc_cell(self.mean[v.name], self.mean[b.name] if b is not None else None)
        width = v.head_dims[0] if v.head_dims else None
        loss = stats.seed_stats([r.loss for r in v.runs])
        runs = "; ".join([f"pretraining: {statuses(v) or 'not started'}"]
                         + [f"{s.name}: {self.stage_status[v.name][s.name] or 'not started'}" for s in self.stages])
        if not self.mean_column and cells:
            cells[0] = mean_cell
        return [f"`{v.name}`" + (" (baseline)" if self.base is v else ""), fmt(v.n_layers),
                f"{fmt(v.heads[0] if v.heads else None)} x {fmt(width)}", *cells,
                *([mean_cell] if self.mean_column else []),
                fmt(loss.mean) if loss.n else "–", params_cell(v, b), memory_cell(v), runs]

    def _table(self, doc: Document) -> list[str]:
        opts: EncoderOptions = self.options
        headers = ["model", "depth", "heads x width", *[stage_column(s)[0] for s in self.stages],
                   *([self.mean_label] if self.mean_column else []), "MLM eval loss", "parameters", "peak memory",
                   "runs"]
        doc.add("## Table 1: depth for heads in pretrained encoders",
                "Leaner Transformers' Table 1 layout: each variant is pretrained as a masked LM, then fine-tuned "
                "once per task from its own pretraining run of the same seed. Scores are in points on each task's "
                "evaluation split (mean ± sd over seeds; " + ", ".join(
                    f"{stage_column(s)[0]}: {stage_column(s)[1]}" for s in self.stages) + ")"
                + (f"; *{self.mean_label}* is the mean over the tasks, per seed" if self.mean_column else "")
                + f"; in parentheses the difference of *{self.mean_label}* from the baseline"
                + (f" `{opts.baseline}`" if opts.baseline else "") + "; parameters and peak memory are the "
                "pretraining runs' (the encoder with its tied decoder, as the paper counts them).")
        names = baseline_tables(doc, opts, self.base, self.study, headers, self._row)
        findings = []
        if len(names) >= 2:
            a, b = self.by_name[names[0]], self.by_name[names[-1]]
            ma, mb = self.mean[a.name], self.mean[b.name]
            if ma.n and mb.n:
                text = (f"Here `{b.name}` scores {mb.mean:.2f} ({self.mean_label}) against {ma.mean:.2f} for "
                        f"`{a.name}` ({mb.mean - ma.mean:+.2f} points, seeds {mb.n} and {ma.n})")
                if a.params and b.params:
                    text += f" with {stats.percent_difference(b.params, a.params):+.0f}% parameters"
                findings.append(text + "; the verdicts below pair them seed by seed.")
        return findings

    def _paper(self, doc: Document) -> list[str]:
        p = self.options.paper
        if p is None:
            return []
        columns = list(dict.fromkeys(c for r in p.rows for c in r.scores))
        doc.add(f"{p.citation} (GLUE validation sets after pretraining on "
                f"{p.pretraining}), quoted as published" + (f"; {p.caveat}" if p.caveat else "") + ":")
        doc.table(["model", *columns, "GLUE", "parameters", "memory"],
                  [[r.shape, *[f"{r.scores[c]:g}" if c in r.scores else "–" for c in columns], f"{r.glue:g}",
                    fmt_params(r.params), f"{r.memory_gb:g} GB" if r.memory_gb else "–"] for r in p.rows])
        findings = []
        if p.claim:
            findings.append(f"The paper's claim: \"{p.claim}\".")
        if len(p.rows) >= 2:
            r0, r1 = p.rows[0], p.rows[-1]
            findings.append(f"{p.citation}: {r1.shape} at GLUE {r1.glue:g} against "
                            f"{r0.glue:g} for {r0.shape} ({r1.glue - r0.glue:+.1f}) with "
                            f"{stats.percent_difference(r1.params, r0.params):+.0f}% parameters.")
        return findings

    def _figure(self, doc: Document) -> None:
        """The mean score against heads per layer, one line per depth, each point labelled with its
        parameters (Leaner Transformers' Fig. 3 for the encoders)."""
        means = self.mean
        done = [v for v in self.study.variants if means[v.name].n and v.uniform]
        if not done:
            return
        fig, axes = new_figure()
        ax, rows = axes[0, 0], []
        for k, depth in enumerate(sorted({v.n_layers for v in done}, reverse=True)):
            vs = sorted((v for v in done if v.n_layers == depth), key=lambda v: v.heads[0])
            draw_accuracy(ax, vs, [float(v.heads[0]) for v in vs], means, f"C{k}", f"{depth} layers", k, rows,
                          lambda v: {"variant": v.name, "n_layers": v.n_layers, "heads_per_layer": v.heads[0],
                                     "params": v.params, "mean": means[v.name].mean, "sd": means[v.name].std,
                                     "seeds": means[v.name].n,
                                     **{s.name: self.task_stats[v.name][s.name].mean for s in self.stages}})
        fixed_ticks(ax, [v.heads[0] for v in done])
        ax.set_xlabel("heads per layer")
        ax.set_ylabel(f"{self.mean_label} (points)")
        ax.legend(fontsize=8)
        doc.figure("score_vs_heads", fig, rows, f"{self.mean_label} after fine-tuning against heads per layer, one "
                   "line per depth (mean over seeds, bars one sd), each point labelled with its parameters.")
