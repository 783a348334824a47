"""The ``lra`` layout (Leaner Transformers on the Long Range Arena: Figs. 8-9, Table 3): per task,
top-1 accuracy against heads per layer at each depth (points labelled with parameters, the task's
reference model dashed), Table 3's rows beside the paper's, seed noise against the reference, and
the findings against the paper's claim.

    [report]
    kind = "lra"
    baseline_shape = "l2-h2"            # the reference model of every task: 2 layers of 2 heads
    table = ["l2-h2", "l1-h4"]          # Table 3's rows (shapes, compared within each task)
    [report.paper]                      # source, table, claim, rows = [{task, shape = "(2, 2)",
    ...                                 # top1, params}], quoted beside the study's tasks

Variants are grouped by their runs' ``task.task`` (never by label), and placed by their runs'
shape: ``lL-hH`` is L layers of H heads each. Accuracy is each run's last ``eval_metrics``
``accuracy``, in %. Welch's tests against the reference are Holm-corrected within each task (the
seed-noise table and the findings each). A study's ``fashion-mnist`` stands in for LRA Image.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from headwise.config import Config
from headwise.errors import HeadwiseError
from headwise.report import stats
from headwise.report.accuracy import (AccuracyLayout, acc_cell, accuracy_values, draw_accuracy, finish_heads_panel,
                                      unscored_note, verdict)
from headwise.report.data import VariantRuns
from headwise.report.document import Document, fmt, fmt_params, new_figure, plural
from headwise.report.paper import PaperTable
from headwise.report.registry import LayoutOptions, register_layout
from headwise.report.sections import ALPHA, cpu_memory_note, memory_cell, params_cell, statuses
from headwise.study.definition import StudyConfig, build_run_config, expand_variants

_SHAPE = re.compile(r"^l(\d+)-h(\d+)$")
_PAPER_SHAPE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*\)$")

#: the paper's name of a task this study's runs may stand in for
STANDS_IN = {"fashion-mnist": "image"}
#: the paper's five tasks, in its order
PAPER_TASKS = ["listops", "text", "retrieval", "image", "pathfinder"]

Shape = tuple[int, int]  # (layers, heads per layer)

#: what the parameter counts can be compared with (tests/test_lra_reference.py builds these models)
PARAMS_NOTE = (
    "Parameter counts depend on each task's vocabulary, positions and classes. The paper preset builds the "
    "Nystromformer code's models (512-row embeddings, 32 for ListOps; positions to the next power of two; the "
    "35-tap value convolution, 140 parameters at both shapes); without the convolution they have that code's "
    "counts at (2, 2) / (1, 4): ListOps 209,802 / 192,906 (the paper's column), Text 370,562 / 353,666, "
    "Retrieval 395,138 / 378,242, Image 174,986 / 158,090, Pathfinder 173,954 / 157,058. The paper's Table 3 "
    "counts for Image (191.2k / 191.2k), Pathfinder (190.2k / 190.2k) and Retrieval (394.8k / 394.8k) are "
    "inconsistent with that architecture, in which (1, 4) always has 16,896 fewer parameters than (2, 2)."
)


def parse_shape(text: str) -> Shape:
    """``l2-h4`` -> (2, 4)."""
    m = _SHAPE.match(text.strip())
    if m is None:
        raise ValueError(f"shape {text!r} is not lL-hH (L layers of H heads, e.g. 'l2-h2')")
    return int(m[1]), int(m[2])


def shape_name(shape: Shape) -> str:
    return f"l{shape[0]}-h{shape[1]}"


def shape_words(shape: Shape) -> str:
    """(1, 4) -> ``(1 layer, 4 heads)``."""
    return f"({plural(shape[0], 'layer')}, {plural(shape[1], 'head')})"


class LRAPaperRow(Config):
    """One model of a published LRA table."""

    task: str
    #: "(depth, heads)", e.g. "(2, 2)"
    shape: str
    top1: float
    params: float = Field(gt=0)

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: str) -> str:
        if _PAPER_SHAPE.match(v) is None:
            raise ValueError(f"shape {v!r} is not '(depth, heads)', e.g. '(2, 2)'")
        return v

    @property
    def dims(self) -> Shape:
        m = _PAPER_SHAPE.match(self.shape)
        assert m is not None  # validated
        return int(m[1]), int(m[2])


class LRAReference(PaperTable[LRAPaperRow]):
    """A published table of LRA models (Leaner Transformers' Table 3) and its claim."""


class LRAOptions(LayoutOptions):
    """The ``[report]`` keys of the lra layout."""

    baseline_shape: str = "l2-h2"
    table: list[str] = Field(default_factory=lambda: ["l2-h2", "l1-h4"])
    paper: LRAReference | None = None

    @field_validator("baseline_shape")
    @classmethod
    def _baseline(cls, v: str) -> str:
        parse_shape(v)
        return v

    @field_validator("table")
    @classmethod
    def _table(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_shape(s)
        return v


class TaskRuns:
    """One task's variants, by shape, with its reference."""

    def __init__(self, name: str, variants: list[VariantRuns], shapes: dict[str, Shape | None],
                 top1: dict[str, stats.SeedStats], base_shape: Shape) -> None:
        self.name = name
        self.variants = variants
        self.shape = {v.name: shapes[v.name] for v in variants}
        self.done = [v for v in variants if top1[v.name].n and self.shape[v.name] is not None]
        self.by_shape: dict[Shape, VariantRuns] = {}
        for v in variants:  # the first variant of a shape represents it (a study has one per task)
            s = self.shape[v.name]
            if s is not None:
                self.by_shape.setdefault(s, v)
        self.base = self.by_shape.get(base_shape)
        self.depths = sorted({self.shape[v.name][0] for v in self.done})  # type: ignore[index]
        self.missing = [v for v in variants if not top1[v.name].n]

    def at(self, depth: int) -> list[VariantRuns]:
        """The completed variants of one depth, by heads."""
        return sorted((v for v in self.done if self.shape[v.name][0] == depth),  # type: ignore[index]
                      key=lambda v: self.shape[v.name][1])  # type: ignore[index]

    @property
    def paper_task(self) -> str:
        return STANDS_IN.get(self.name, self.name)


@register_layout
class LRALayout(AccuracyLayout):
    """Depth traded for heads in Nyströmformers on the Long Range Arena: Leaner Transformers' Figs. 8-9
    and Table 3, per task."""

    kind = "lra"
    Options = LRAOptions
    conditioning_caption = "heads per layer, one line per task and depth"

    def setup(self) -> None:
        vs = self.study.variants
        planned = _planned(self.study.record.definition)
        self.task_of = {v.name: self._task(v, planned.get(v.name) or {}) for v in vs}
        self.shape_of = {v.name: self._shape(v, planned.get(v.name) or {}) for v in vs}
        self.top1 = {v.name: stats.seed_stats(accuracy_values(v)) for v in vs}
        self.base_shape = parse_shape(self.options.baseline_shape)
        names = list(dict.fromkeys(t for t in self.task_of.values()))
        self.tasks = [TaskRuns(t, [v for v in vs if self.task_of[v.name] == t], self.shape_of, self.top1,
                               self.base_shape) for t in names]

    @staticmethod
    def _task(v: VariantRuns, planned: dict[str, Any]) -> str:
        """The LRA task of the variant's runs (of its planned config before any run wrote one)."""
        for config in (v.info.config if v.info else {}, *(r.config for r in v.runs), planned):
            task = config.get("task", {}).get("task") if isinstance(config.get("task"), dict) else None
            if task:
                return str(task)
        return "unknown task"

    @staticmethod
    def _shape(v: VariantRuns, planned: dict[str, Any]) -> Shape | None:
        """(layers, heads per layer) of the variant's runs; None when its layers differ."""
        if v.plan is not None:
            return (v.n_layers, v.heads[0]) if v.uniform else None  # type: ignore[return-value]
        model = planned.get("model", {})
        layers, heads = model.get("n_layers"), model.get("heads")
        if isinstance(heads, list):
            heads = heads[0] if heads and len(set(heads)) == 1 else None
        return (layers, heads) if isinstance(layers, int) and isinstance(heads, int) else None

    def group(self, v: VariantRuns) -> str:
        s = self.shape_of[v.name]
        return f"{self.task_of[v.name]}, {plural(s[0], 'layer')}" if s else v.name

    def panel(self, v: VariantRuns) -> str:
        return self.group(v)

    def panel_order(self, first: dict[str, VariantRuns]) -> list[str]:
        order = {t.name: i for i, t in enumerate(self.tasks)}
        return sorted(first, key=lambda p: (order.get(self.task_of[first[p].name], 0), first[p].n_layers or 0))

    def heads_of(self, v: VariantRuns) -> int:
        return self.shape_of[v.name][1]  # type: ignore[index]

    def sections(self, doc: Document) -> list[str]:
        self._figures(doc)
        self._tables(doc)
        noise = self._noise(doc)
        return self._verdicts() + noise

    # ------------------------------------------------------------------ Figs. 8-9

    def _point(self, v: VariantRuns) -> dict[str, Any]:
        s = self.top1[v.name]
        layers, heads = self.shape_of[v.name]  # type: ignore[misc]
        return dict(task=self.task_of[v.name], variant=v.name, n_layers=layers, heads_per_layer=heads,
                    params=v.params, top1_mean=s.mean, top1_sd=s.std, seeds=s.n)

    def _figures(self, doc: Document) -> None:
        doc.add("## Accuracy vs heads per layer, by task and depth",
                "The paper's Figs. 8-9 per task: top-1 accuracy on the held-out set against heads per layer (head "
                "width fixed, so the model widens with heads), one panel per depth, each point labelled with its "
                "parameters; the dashed line is the task's reference "
                f"`{self.options.baseline_shape}` {shape_words(self.base_shape)}.")
        for t in self.tasks:
            if not t.depths:
                continue
            fig, axes = new_figure(4.6 * len(t.depths), 4.2, ncols=len(t.depths), sharey=True)
            rows: list[dict[str, Any]] = []
            for k, depth in enumerate(t.depths):
                ax = axes[0, k]
                vs = t.at(depth)
                x = [self.heads_of(v) for v in vs]
                draw_accuracy(ax, vs, x, self.top1, f"C{k}", None, k, rows, self._point)
                self.reference_line(ax, t.base, f"reference {shape_name(self.base_shape)}")
                finish_heads_panel(ax, x, plural(depth, "layer"))
            axes[0, 0].set_ylabel("top-1 accuracy (%)")
            fig.suptitle(f"{t.name}: top-1 accuracy vs heads per layer (labels: parameters)")
            doc.add(f"### {t.name}")
            doc.figure(f"accuracy_vs_heads_{_slug(t.name)}", fig, rows,
                       f"{t.name}: top-1 accuracy against heads per layer, one panel per depth"
                       + (", error bars one sd over seeds" if any(self.top1[v.name].n > 1 for v in t.done) else "")
                       + "; the dashed line is the reference"
                       + (f" `{t.base.name}`" if t.base is not None else " (not run)") + ".")
            for depth in t.depths:
                doc.add(self.heads_line(f"{t.name}, top-1 % at {plural(depth, 'layer')}", t.at(depth)))
            if t.base is not None and self.top1[t.base.name].n:
                doc.add(f"{t.name}, the reference `{t.base.name}` (dashed line): top-1 % "
                        f"{acc_cell(self.top1[t.base.name])} [{fmt_params(t.base.params)}].")

    # ------------------------------------------------------------------ Table 3

    def _paper_rows(self, t: TaskRuns) -> dict[Shape, LRAPaperRow]:
        p = self.options.paper
        return {} if p is None else {r.dims: r for r in p.rows if r.task == t.paper_task}

    def _row(self, t: TaskRuns, v: VariantRuns, paper: dict[Shape, LRAPaperRow] | None) -> list[str]:
        b = t.base if t.base is not v else None
        top1 = acc_cell(self.top1[v.name], self.top1[b.name] if b is not None else None)
        shape = self.shape_of[v.name]
        row = [f"`{v.name}`" + (" (reference)" if t.base is v else ""), f"({shape[0]}, {shape[1]})" if shape else "–",
               top1, params_cell(v, b, digits=1), memory_cell(v), fmt(v.mean("tokens_per_s"), 0),
               statuses(v) or "not started"]
        if paper is not None:
            r = paper.get(shape) if shape else None
            ref = paper.get(self.base_shape)
            row += ["–", "–"] if r is None else [
                f"{r.top1:g}" + (f" ({r.top1 - ref.top1:+.2f})" if ref is not None and ref is not r else ""),
                fmt_params(r.params) + (f" ({stats.percent_difference(r.params, ref.params):+.1f}%)"
                                        if ref is not None and ref is not r else "")]
        return row

    def _tables(self, doc: Document) -> None:
        opts: LRAOptions = self.options
        p = opts.paper
        speed = f"{self.study.unit}/s"
        headers = ["model", "(depth, heads)", "top-1 %", "parameters", "peak memory", speed, "runs"]
        source = f"{p.source}'s {p.table}" if p else ""
        doc.add("## Table 3: depth for heads, per task",
                "Leaner Transformers' Table 3 layout, per task: top-1 accuracy on the held-out set (mean ± sd over "
                "seeds; in parentheses the difference from the task's reference in points), parameters (in "
                "parentheses their difference from the reference), peak training memory and training "
                f"throughput; the reference is `{opts.baseline_shape}` {shape_words(self.base_shape)}"
                + (f". Beside them, {source}'s rows for the same task and shape, quoted as published"
                   + (f" ({p.caveat})" if p.caveat else "") if p else "") + ".")
        wanted = [parse_shape(s) for s in opts.table]
        for t in self.tasks:
            paper = self._paper_rows(t) if p else None
            doc.add(f"### {t.name}")
            if t.base is None:
                doc.add(f"**{t.name} has no `{opts.baseline_shape}` variant**, so nothing is compared against the "
                        "reference.")
            rows = [t.by_shape[s] for s in wanted if s in t.by_shape]
            rest = [v for v in t.variants if v not in rows]
            extra = [f"{p.table} top-1 %", f"{p.table} parameters"] if p else []
            if rows:
                doc.table(headers + extra, [self._row(t, v, paper) for v in rows])
            if p is not None and not paper:
                doc.add(f"{p.citation} has no rows for {t.name}.")
            if t.name == "listops" and self._listops_variant(t) == "short":
                doc.add("ListOps here is the short variant (20-100 tokens), not LRA's 500-2,000: the paper's numbers "
                        "are quoted for scale, not as a like-for-like target.")
            if t.name in STANDS_IN:
                doc.add(f"`{t.name}` stands in for LRA {STANDS_IN[t.name].capitalize()}, which the paper ran on "
                        "CIFAR-10 (1,024 grayscale pixel tokens): its numbers are quoted for scale, not as a "
                        "like-for-like target.")
            if rest:
                doc.add(f"The other shapes on {t.name}:")
                doc.table(headers, [self._row(t, v, None) for v in rest])
            unscored_note(doc, f"{t.name}, without", t.missing)
        if p is not None:
            ran = {t.paper_task for t in self.tasks}
            skipped = [x for x in dict.fromkeys([*PAPER_TASKS, *(r.task for r in p.rows)])
                       if x not in ran and any(r.task == x for r in p.rows)]
            if skipped:
                doc.add(f"Tasks of {source} this study did not run: {', '.join(skipped)}.")
        doc.add(PARAMS_NOTE)
        cpu_memory_note(doc, next((v.info for t in self.tasks for v in t.done if v.info is not None), None))

    @staticmethod
    def _listops_variant(t: TaskRuns) -> str | None:
        """The ListOps generator variant of the task's runs (standard or short)."""
        for v in t.variants:
            for r in v.runs:
                listops = r.config.get("task", {}).get("listops")
                if isinstance(listops, dict):
                    return str(listops.get("variant", "standard"))
                if r.config.get("task"):
                    return "standard"
        return None

    # ------------------------------------------------------------------ seed noise

    def _noise(self, doc: Document) -> list[str]:
        """Each task's variants against its reference: points, Welch's test, Holm within the task."""
        per = [(t, comps) for t in self.tasks if (comps := self.against(t.done, t.base))]
        if not per:
            return []
        doc.add("## Differences from the reference and seed noise",
                "Each variant's top-1 against its task's reference, in points (positive = more accurate), with "
                "Welch's unequal-variance t-test across seeds (two-sided) and Holm's correction over the "
                f"comparisons of each task; distinguishable means Holm-adjusted p < {ALPHA}.")
        findings = []
        for t, comps in per:
            doc.add(f"### {t.name} (against `{t.base.name}`)")  # type: ignore[union-attr]
            text, testable = self.noise_report(doc, comps, against="reference")
            findings.append(f"{t.name}: {text[:1].lower()}{text[1:]}" if testable else text)
        return list(dict.fromkeys(findings))

    # ------------------------------------------------------------------ findings

    def _verdicts(self) -> list[str]:
        p = self.options.paper
        out = []
        for t in self.tasks:
            parts: list[tuple[str, stats.Comparison | None, bool]] = []
            for depth in t.depths:
                vs = t.at(depth)
                if len(vs) < 2:
                    continue
                text, rises = self.heads_trend(f"{t.name}, accuracy vs heads at {plural(depth, 'layer')}", vs)
                parts.append((text, self.compare(vs[-1], vs[0]), rises))
            base = t.base if t.base in t.done else None
            paper = self._paper_rows(t)
            for shape in map(parse_shape, self.options.table):
                if shape == self.base_shape:
                    continue
                v = t.by_shape.get(shape)
                if base is None or v is None or v not in t.done:
                    parts.append((f"{t.name}, {shape_words(shape)} against the reference "
                                  f"{shape_words(self.base_shape)}: untested (" + (
                                      "no completed reference run" if base is None else
                                      f"no completed `{shape_name(shape)}` run") + ").", None, False))
                    continue
                d = self.acc(v) - self.acc(base)
                fewer = bool(v.params and base.params and v.params <= base.params)
                pct = (f" with {stats.percent_difference(v.params, base.params):+.1f}% parameters"
                       if v.params and base.params else "")
                r, ref = paper.get(shape), paper.get(self.base_shape)
                quoted = (f" [{p.source if p else 'the paper'}: {r.top1 - ref.top1:+.2f} points with "
                          f"{stats.percent_difference(r.params, ref.params):+.1f}% parameters]"
                          if r is not None and ref is not None else "")
                parts.append((f"{t.name}, `{v.name}` {shape_words(shape)} against the reference `{base.name}`: "
                              f"{self.acc(v):.2f}% vs {self.acc(base):.2f}% ({d:+.2f} points){pct}{quoted}; "
                              + ("better with no more parameters" if d > 0 and fewer else
                                 "better but with more parameters" if d > 0 else "not better") + ": ",
                              self.compare(v, base), d > 0 and fewer))
            stats.apply_holm([c for _, c, _ in parts if c is not None])
            out += [text if text.endswith(".") else text + verdict(c, holds) + "." for text, c, holds in parts]
        return self.with_claim(out, ", task by task (Welch's tests Holm-corrected within each task)")


def _planned(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each variant's run config as the study plans it (its base with the variant's keys set), to place
    variants whose runs have not written theirs; empty where the definition no longer expands."""
    try:
        config = StudyConfig.parse(definition)
        return {v.name: build_run_config(config.base, v)[0] for v in expand_variants(config)}
    except (HeadwiseError, ValueError, TypeError):
        return {}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)
