"""``headwise report STUDY_DIR``: ``report/report.md`` with PNG figures and the CSV behind each.

Three layouts (the study's ``[report] kind``):

- ``heads`` (the blog): final eval loss vs total heads per scheme with exponential fits, the
  fitted difference between schemes at a chosen total, seed statistics and Welch's t-tests;
- ``depth`` (Leaner Transformers): Table 2 (loss, parameters, peak memory against the baseline),
  loss vs heads per layer for each depth, loss vs parameters;
- ``rank`` (Amsel et al.): error vs rank per head for each width and depth, error vs sequence
  length, with the "learned nothing" baseline.

All layouts add the results table, training time and tokens/s vs heads, eval-loss curves, and
for language tasks samples from each trained model and an untrained one. Figures use
matplotlib's object API with the Agg canvas (no display, no global pyplot state).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError
from headwise.study import stats
from headwise.study.layout import REPORT_DIR, StudyRecord, load_study_record, run_dir
from headwise.study.results import (
    read_metrics, read_run_config, read_summary, rows_to_csv, study_run_status, update_results,
)

ALPHA = 0.05


# --------------------------------------------------------------------------- data


@dataclass
class Run:
    """One run of the study as found on disk."""

    variant: str
    seed: int
    labels: dict[str, str]
    path: Path
    status: str
    summary: dict[str, Any]
    config: dict[str, Any]

    @property
    def loss(self) -> float | None:
        v = self.summary.get("final_eval_loss")
        return float(v) if self.status == "completed" and isinstance(v, (int, float)) and math.isfinite(v) else None

    @property
    def model(self) -> dict[str, Any]:
        return self.config.get("model", {})

    @property
    def task(self) -> dict[str, Any]:
        return self.config.get("task", {})

    def metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)


@dataclass
class Variant:
    """A variant and its runs (one per seed)."""

    name: str
    labels: dict[str, str]
    runs: list[Run] = field(default_factory=list)

    @property
    def done(self) -> list[Run]:
        return [r for r in self.runs if r.loss is not None]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.done]  # type: ignore[misc]

    @property
    def stats(self) -> stats.SeedStats:
        return stats.seed_stats(self.losses)

    @property
    def info(self) -> Run | None:
        """A run with a summary (for the shape, which every seed shares)."""
        return next((r for r in self.runs if r.summary.get("heads")), None)

    def value(self, key: str) -> Any:
        run = self.info
        return None if run is None else run.summary.get(key)

    def mean(self, key: str) -> float | None:
        vals = [float(r.summary[key]) for r in self.done if isinstance(r.summary.get(key), (int, float))]
        return float(np.mean(vals)) if vals else None

    @property
    def heads(self) -> list[int]:
        return list(self.value("heads") or [])

    @property
    def total_heads(self) -> int | None:
        return self.value("total_heads")

    @property
    def n_layers(self) -> int | None:
        run = self.info
        return None if run is None else run.model.get("n_layers", len(self.heads))

    @property
    def head_dims(self) -> list[int]:
        return list(self.value("head_dims") or [])

    @property
    def params(self) -> int | None:
        return self.value("params")

    @property
    def peak_mb(self) -> float | None:
        v = self.mean("peak_memory_bytes")
        return None if v is None else v / 2**20


def load_variants(record: StudyRecord) -> list[Variant]:
    """Every variant of the study with whatever its runs have written."""
    out = []
    for entry in record.variants:
        v = Variant(entry["name"], dict(entry.get("labels", {})))
        for seed in range(record.seeds):
            path = run_dir(record.path, v.name, seed)
            status = study_run_status(record, v.name, seed)
            v.runs.append(Run(v.name, seed, v.labels, path, status, read_summary(path) or {},
                              read_run_config(path) or {}))
        out.append(v)
    return out


# --------------------------------------------------------------------------- output helpers


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _fmt_params(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return str(int(n))


def _fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _loss_cell(v: Variant) -> str:
    s = v.stats
    if s.n == 0:
        return "–"
    if s.n == 1:
        return f"{s.mean:.4f}"
    return f"{s.mean:.4f} ± {s.std:.4f} (n={s.n})"


def _n(count: int, word: str) -> str:
    """``1 layer``, ``2 layers``."""
    return f"{count} {word}" + ("" if count == 1 else "s")


def _heads_str(heads: list[int]) -> str:
    if not heads:
        return "–"
    if len(set(heads)) == 1 and len(heads) > 4:
        return f"{heads[0]} x {len(heads)}"
    return ", ".join(map(str, heads))


class _Doc:
    """The report being written: markdown lines plus figures saved beside it."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.figures: list[Path] = []

    def add(self, *lines: str) -> None:
        """Append lines as one block (a heading is set apart from what follows it)."""
        for k, line in enumerate(lines):
            self.lines.append(line)
            if line.startswith("#") and k < len(lines) - 1:
                self.lines.append("")
        self.lines.append("")

    def table(self, headers: list[str], rows: Iterable[list[Any]]) -> None:
        self.lines.append("| " + " | ".join(headers) + " |")
        self.lines.append("|" + "|".join("---" for _ in headers) + "|")
        for r in rows:
            self.lines.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
        self.lines.append("")

    def figure(self, name: str, fig: Figure, rows: list[dict[str, Any]], caption: str) -> None:
        """Save ``fig`` as NAME.png and ``rows`` as NAME.csv, and link both."""
        png = self.out / f"{name}.png"
        fd, tmp = tempfile.mkstemp(dir=self.out, prefix=f".{name}.", suffix=".png")
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=130)
            os.replace(tmp, png)
        finally:
            Path(tmp).unlink(missing_ok=True)
        atomic_write_text(self.out / f"{name}.csv", rows_to_csv(rows))
        self.figures.append(png)
        self.add(f"![{caption}]({name}.png)", f"*{caption}* Data: [{name}.csv]({name}.csv).")


def _new_figure(width: float = 7.5, height: float = 4.6, ncols: int = 1, nrows: int = 1,
                sharey: bool = False) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    return fig, axes


def _log2_ticks(ax: Any, values: Iterable[float]) -> None:
    vals = sorted({v for v in values if v and v > 0})
    if not vals:
        return
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in vals])


# --------------------------------------------------------------------------- report


@contextmanager
def _one_thread() -> Iterator[None]:
    """Evaluate the final models (decoding, conditioning) on one thread: they are small per-token
    ops where a second thread mostly spins, and on a busy CPU badly (measured here: 0.28 s on one
    thread against 4.4 s on two for one model's conditioning)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_report(
    study_dir: str | Path,
    *,
    at_heads: float | None = None,
    samples: bool = True,
    conditioning: bool = True,
    echo: Callable[[str], None] = print,
) -> Path:
    """Write ``STUDY_DIR/report/report.md`` (and its figures); returns its path."""
    record = load_study_record(study_dir)
    update_results(record)
    spec = record.report
    out = record.path / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    variants = load_variants(record)
    cache = _Cache(out / ".cache.json")
    doc = _Doc(out)
    _header(doc, record, variants)
    findings_at = len(doc.lines)
    findings: list[str] = []
    if not any(v.done for v in variants):
        doc.add("No run has completed yet: rerun the study to finish them, then `headwise report` again.")
    elif spec.kind == "heads":
        findings += _heads_section(doc, record, variants, at_heads if at_heads is not None else spec.at_heads)
    elif spec.kind == "depth":
        findings += _depth_section(doc, record, variants)
    else:
        echo("report: scoring the final models")
        with _one_thread():
            findings += _rank_section(doc, record, variants)
    _results_table(doc, record, variants)
    if any(v.done for v in variants):
        _time_section(doc, record, variants)
        _curves_section(doc, record, variants)
        with _one_thread():
            if spec.kind in ("heads", "depth"):
                if conditioning:
                    echo("report: conditioning of the final models")
                _conditioning_section(doc, record, variants, conditioning, cache)
            if samples:
                if any(r.task.get("kind", "lm") == "lm" for v in variants for r in v.done):
                    echo(f"report: samples from {sum(1 for v in variants if v.done)} models")
                _samples_section(doc, record, variants, cache)
    _reproduce(doc, record)
    if findings:
        doc.lines[findings_at:findings_at] = ["## Findings", "", *[f"- {f}" for f in findings], ""]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(doc.lines).rstrip() + "\n")
    return path


def _header(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> None:
    counts = Counter(r.status for v in variants for r in v.runs)
    status = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    title = f"# Study `{record.name}`" + (f" (preset `{record.preset}`)" if record.preset else "")
    lines = [title, record.description]
    if record.preset_summary:
        lines += ["", f"Preset `{record.preset}`: {record.preset_summary}."]
    lines += ["", f"{len(variants)} variants x {_n(record.seeds, 'seed')}: {status}. "
                  f"Study directory `{record.path}`; generated {time.strftime('%Y-%m-%d %H:%M')}."]
    first = next((r for v in variants for r in v.done), None)
    if first is not None:
        lines += ["", f"Setup (from `{first.path.relative_to(record.path)}`): {_describe_setup(first)}."]
    doc.add(*lines)


def _describe_setup(run: Run) -> str:
    """One line on the task, model size and training of a run."""
    s, m, task = run.summary, run.model, run.task
    if task.get("kind", "lm") == "nearest":
        what = f"nearest-neighbour task, d = {task.get('dim')}, N = {task.get('n_points')} points ({task.get('variant', 'farthest')})"
    else:
        desc = s.get("task") or {}
        what = (f"language modelling on {Path(str(task.get('source'))).name}, tokenizer {task.get('tokenizer')}, "
                f"{desc.get('tokens_per_epoch', '?')} training tokens, sequences of {task.get('block_size')}, "
                f"{desc.get('eval_tokens', '?')} eval tokens")
    return (f"{what}; d_model {m.get('d_model')}; {s.get('steps')} steps of {s.get('tokens_per_step')} tokens "
            f"({s.get('tokens')} in all), AdamW lr {run.config.get('optim', {}).get('lr')}, {s.get('precision')} on "
            f"{s.get('device')}")


def _results_table(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> None:
    doc.add("## All runs", "Final eval loss is the mean over seeds ± the sample standard deviation; "
            "times and tokens/s are means over completed seeds; peak memory is CUDA max allocated on a GPU, "
            "peak resident memory of the process on CPU. Per-run rows: [results.csv](../results.csv).")
    rows = []
    for v in variants:
        statuses = Counter(r.status for r in v.runs)
        rows.append([
            f"`{v.name}`", _heads_str(v.heads), _fmt(v.total_heads), _heads_str(v.head_dims), _fmt_params(v.params),
            _fmt(v.peak_mb, 0), _loss_cell(v), _fmt(v.mean("train_time_s"), 1), _fmt(v.mean("tokens_per_s"), 0),
            ", ".join(f"{n} {s}" for s, n in statuses.items()),
        ])
    doc.table(["variant", "heads per layer", "total heads", "head_dim", "params", "peak memory (MiB)",
               "final eval loss", "train time (s)", "tokens/s", "runs"], rows)


# --------------------------------------------------------------------------- heads (the blog)


def _series_of(record: StudyRecord, v: Variant) -> str:
    axis = record.report.series
    return v.labels.get(axis, "all") if axis else "all"


def _group_of(record: StudyRecord, v: Variant) -> tuple[str, ...]:
    axis = record.report.series
    return tuple(lab for k, lab in v.labels.items() if k != axis)


def _series_order(record: StudyRecord, variants: list[Variant]) -> list[str]:
    order: list[str] = []
    for v in variants:
        s = _series_of(record, v)
        if s not in order:
            order.append(s)
    base = record.report.baseline
    if base in order:
        order.remove(base)
        order.insert(0, base)
    return order


_LABEL_SIDES = [(6, 5, "left"), (6, -12, "left"), (-6, -12, "right"), (-6, 5, "right")]


def _heads_section(doc: _Doc, record: StudyRecord, variants: list[Variant], at_heads: float | None) -> list[str]:
    findings: list[str] = []
    order = _series_order(record, variants)
    base = record.report.baseline if record.report.baseline in order else None
    colors = {s: f"C{i}" for i, s in enumerate(order)}
    # fits on every completed seed (one point per run)
    fits: dict[str, stats.ExpFit | None] = {}
    for s in order:
        pts = [(v.total_heads, x) for v in variants if _series_of(record, v) == s for x in v.losses]
        fits[s] = stats.fit_exponential([p[0] for p in pts], [p[1] for p in pts]) if pts else None
    fitted = [s for s in order if fits[s] is not None]
    if at_heads is None and fitted:
        at_heads = float(min(max(v.total_heads for v in variants if _series_of(record, v) == s and v.done)
                             for s in fitted))
    # figure: loss vs total heads
    fig, axes = _new_figure(8.0, 5.0)
    ax = axes[0, 0]
    rows: list[dict[str, Any]] = []
    for s in order:
        vs = [v for v in variants if _series_of(record, v) == s and v.done]
        if not vs:
            continue
        vs.sort(key=lambda v: v.total_heads)
        xs = [v.total_heads for v in vs]
        means = [v.stats.mean for v in vs]
        errs = [v.stats.std if v.stats.n > 1 else 0.0 for v in vs]
        multi = any(v.stats.n > 1 for v in vs)
        ax.errorbar(xs, means, yerr=errs if multi else None, fmt="o", color=colors[s], capsize=3, label=s, zorder=3)
        for v in vs:
            if v.stats.n > 1:
                ax.scatter([v.total_heads] * v.stats.n, v.losses, color=colors[s], s=8, alpha=0.35, zorder=2)
            # a different side per series, so that labels of nearby points do not collide
            dx, dy, ha = _LABEL_SIDES[order.index(s) % len(_LABEL_SIDES)]
            ax.annotate(",".join(map(str, v.heads)), (v.total_heads, v.stats.mean), textcoords="offset points",
                        xytext=(dx, dy), ha=ha, fontsize=7, color=colors[s])
            rows.append(dict(kind="point", series=s, variant=v.name, heads=" ".join(map(str, v.heads)),
                             total_heads=v.total_heads, loss_mean=v.stats.mean,
                             loss_sd=v.stats.std if v.stats.n > 1 else None, seeds=v.stats.n))
        fit = fits[s]
        if fit is not None:
            hi = max(xs[-1], at_heads or 0)
            grid = np.linspace(xs[0], hi, 200)
            ax.plot(grid, fit(grid), color=colors[s], lw=1.2, alpha=0.8)
            rows += [dict(kind="fit", series=s, total_heads=float(x), loss_mean=float(fit(x))) for x in grid[::10]]
    if at_heads is not None and fitted:
        ax.axvline(at_heads, color="0.5", ls=":", lw=1)
    ax.set_xlabel("total attention heads (all layers)")
    ax.set_ylabel("final eval loss")
    ax.set_title("Final eval loss vs total heads" + (" (lines: exponential fits)" if fitted else ""))
    ax.grid(alpha=0.3)
    ax.legend(title=record.report.series or "series")
    doc.add("## Loss vs total heads")
    doc.figure("loss_vs_heads", fig, rows, "Final eval loss against the total number of heads, one colour per "
               f"{record.report.series or 'series'}; labels give the heads per layer"
               + ("; error bars are ± one standard deviation over seeds, faint dots single seeds" if record.seeds > 1
                  else "") + ".")
    # fits table
    if fitted:
        doc.add(f"Fit form: `{stats.EXP_FORM}` (least squares on every completed run, `scipy.optimize.curve_fit` "
                "started from a grid search over c). With three totals per series the fit has no residual "
                "degrees of freedom: it interpolates, as the blog's fits did.")
        boot: dict[str, tuple[float, float]] = {}
        if base is not None and at_heads is not None and record.seeds > 1:
            pts = {s: [(v.total_heads, v.losses) for v in variants if _series_of(record, v) == s and v.done]
                   for s in fitted}
            boot = stats.bootstrap_fit_difference(pts, base, at_heads)
        trows = []
        for s in order:
            f = fits[s]
            if f is None:
                trows.append([s, "–", "–", "–", "–", "–", "too few distinct totals (need 3)", "–"])
                continue
            pct = "–"
            ci = "–"
            if base is not None and fits.get(base) is not None and s != base and at_heads is not None:
                d = stats.percent_difference(float(f(at_heads)), float(fits[base](at_heads)))  # type: ignore[misc]
                pct = f"{d:+.2f}%"
                if s in boot:
                    ci = f"[{boot[s][0]:+.2f}%, {boot[s][1]:+.2f}%]"
                word = "lower (better)" if d < 0 else "higher (worse)"
                findings.append(f"At {at_heads:g} total heads the fitted {s} curve is {abs(d):.2f}% {word} than "
                                f"{base} ({float(f(at_heads)):.4f} vs {float(fits[base](at_heads)):.4f})"  # type: ignore[misc]
                                + (f"; 95% bootstrap interval over seeds {ci}" if ci != "–" else "") + ".")
            trows.append([s, f"{f.a:.4f}", f"{f.b:.4f}", f"{f.c:.4g}", f.n_points,
                          _fmt(float(f(at_heads)) if at_heads is not None else None),
                          (pct + (f" (95% CI {ci})" if ci != "–" else "")) if s != base else "baseline",
                          f.note or "–"])
        if record.report.series == "scheme" and base == "constant":
            findings.append("For comparison, the blog's fits at 180 heads: descending 0.3% better and ascending 4.5% "
                            "worse than constant (one seed each, d_model 768, 250k stories).")
        doc.table(["series", "a", "b", "c", "points", f"fitted loss at {at_heads:g} heads" if at_heads else "fitted loss",
                   f"difference vs {base}" if base else "difference", "note"], trows)
        if record.seeds > 1:
            doc.add("The interval resamples each point's seeds with replacement (400 draws), refits both curves "
                    "and takes the 2.5th and 97.5th percentiles of the difference.")
    else:
        doc.add("No fit: an exponential fit needs at least three distinct totals of heads per series; the "
                "comparison below is between runs at the same budget.")
    findings += _significance(doc, record, variants, base, order)
    return findings


def _significance(doc: _Doc, record: StudyRecord, variants: list[Variant], base: str | None,
                  order: list[str]) -> list[str]:
    """Each variant against the baseline series at the same values of the other axes."""
    if base is None:
        return []
    by_key = {(_series_of(record, v), _group_of(record, v)): v for v in variants}
    comps: list[tuple[Variant, Variant, stats.Comparison]] = []
    for v in variants:
        s = _series_of(record, v)
        ref = by_key.get((base, _group_of(record, v)))
        if s == base or ref is None or not v.done or not ref.done:
            continue
        comps.append((v, ref, stats.compare(v.name, v.losses, ref.name, ref.losses)))
    return _comparison_table(doc, record, comps, f"the {base} variant at the same budget")


def _comparison_table(doc: _Doc, record: StudyRecord, comps: list[tuple[Variant, Variant, stats.Comparison]],
                      against: str, summarize: bool = True) -> list[str]:
    doc.add("## Differences and seed noise")
    if not comps:
        doc.add("No completed pairs to compare.")
        return []
    stats.apply_holm([c for _, _, c in comps])
    testable = any(c.testable for _, _, c in comps)
    findings = ["Measured final eval loss: " + "; ".join(
        f"`{v.name}` {c.percent:+.2f}% vs `{ref.name}` ({v.stats.mean:.4f} vs {ref.stats.mean:.4f})"
        for v, ref, c in comps) + "."] if summarize else []
    rows = []
    for v, ref, c in comps:
        if c.testable:
            verdict = "distinguishable from seed noise" if c.p_holm < ALPHA else "within seed noise"
        else:
            verdict = "no claim (needs >= 2 seeds each)"
        rows.append([f"`{v.name}`", f"`{ref.name}`", _loss_cell(v), _loss_cell(ref), f"{c.percent:+.2f}%",
                     _fmt(c.t, 2), _fmt_p(c.p), _fmt_p(c.p_holm), verdict])
    doc.add(f"Each variant against {against}: the difference of mean final eval loss (negative = lower = better), "
            "and Welch's unequal-variance t-test across seeds (two-sided, `scipy.stats.ttest_ind(equal_var=False)`), "
            f"with Holm's correction over the {len(comps)} comparisons; distinguishable means Holm-adjusted p < {ALPHA}.")
    doc.table(["variant", "baseline", "loss", "baseline loss", "difference", "Welch t", "p", "p (Holm)", "verdict"],
              rows)
    if not testable:
        seeds = "one seed" if record.seeds == 1 else f"{record.seeds} seeds"
        text = (f"Each configuration was trained with {seeds}, so no claim can be made about whether "
                "these differences exceed seed-to-seed noise; rerun with `--seeds 3` (or more) to test them.")
        doc.add(f"**{text}**")
        findings.append(text)
    else:
        sig = [c.name for _, _, c in comps if c.testable and c.p_holm < ALPHA]
        findings.append(f"With {record.seeds} seeds, {len(sig)} of {len(comps)} differences from the baseline are "
                        f"distinguishable from seed noise (Welch's t-test, Holm-corrected, alpha {ALPHA})"
                        + (f": {', '.join(sig)}" if sig else "") + ".")
    return findings


# --------------------------------------------------------------------------- depth (Leaner Transformers)


def _depth_section(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> list[str]:
    findings: list[str] = []
    by_name = {v.name: v for v in variants}
    base = by_name.get(record.report.baseline or "")
    doc.add("## Table 2: depth for heads",
            "Leaner Transformers' Table 2 layout: validation loss, parameters and peak training memory, each "
            f"against the baseline `{record.report.baseline}`. The paper reports GPT-2 12 x 12 at 2.47 / 89M / 12.8 GB "
            "against 4 x 16 at 2.41 / 64M (-28%) / 9.7 GB (-24%) on TinyStories; it does not say whether d_model or "
            "head_dim was held fixed, so both are shown.")
    names = record.report.table or [v.name for v in variants]
    rows = []
    for name in names:
        v = by_name.get(name)
        if v is None:
            continue
        shape = f"{v.n_layers} layers x {v.heads[0] if v.heads else '?'} heads, head_dim {v.head_dims[0] if v.head_dims else '?'}"
        if base is not None and v is not base and base.params and v.params:
            dp = f" ({stats.percent_difference(v.params, base.params):+.0f}%)"
            dm = (f" ({stats.percent_difference(v.peak_mb, base.peak_mb):+.0f}%)"
                  if v.peak_mb and base.peak_mb else "")
            dl = (f" ({stats.percent_difference(v.stats.mean, base.stats.mean):+.2f}%)"
                  if v.done and base.done else "")
        else:
            dp = dm = dl = ""
        rows.append([f"`{v.name}`" + (" (baseline)" if v is base else ""), shape, _loss_cell(v) + dl,
                     _fmt_params(v.params) + dp, (_fmt(v.peak_mb, 0) + " MiB" + dm) if v.peak_mb else "–"])
        if base is not None and v is not base and v.done and base.done and v.params and base.params:
            better = "lower" if v.stats.mean < base.stats.mean else "higher"
            findings.append(
                f"`{v.name}` ({shape}): eval loss {v.stats.mean:.4f} vs {base.stats.mean:.4f} for the baseline "
                f"({better}, {stats.percent_difference(v.stats.mean, base.stats.mean):+.2f}%), with "
                f"{stats.percent_difference(v.params, base.params):+.0f}% parameters"
                + (f" and {stats.percent_difference(v.peak_mb, base.peak_mb):+.0f}% peak memory" if v.peak_mb and base.peak_mb else "")
                + ".")
    if len(findings) > 0:
        findings.append("For comparison, the paper's Table 2: 4 x 16 at val. loss 2.41 against 2.47 for GPT-2 12 x 12, "
                        "with -28% parameters and -24% training memory.")
    doc.table(["model", "shape", "val. loss", "parameters", "peak memory"], rows)
    if base is not None and base.info is not None and str(base.info.summary.get("device", "")).startswith("cpu"):
        doc.add("On CPU, peak memory is the resident memory of the whole training process, most of it the Python "
                "and PyTorch runtime, so its differences understate those of the models themselves.")
    # loss vs heads per layer, one series per depth (grid variants: uniform layers)
    grid = [v for v in variants if v.done and v.heads and len(set(v.heads)) == 1 and "layers" in v.labels]
    extra = [v for v in variants if v.done and v not in grid]
    depths = sorted({v.n_layers for v in grid})
    fig, axes = _new_figure(8.0, 5.0)
    ax = axes[0, 0]
    rows2: list[dict[str, Any]] = []
    for i, L in enumerate(depths):
        vs = sorted((v for v in grid if v.n_layers == L), key=lambda v: v.heads[0])
        xs = [v.heads[0] for v in vs]
        ys = [v.stats.mean for v in vs]
        err = [v.stats.std if v.stats.n > 1 else 0.0 for v in vs]
        ax.errorbar(xs, ys, yerr=err if record.seeds > 1 else None, marker="o", color=f"C{i}", capsize=3,
                    label=f"{L} layers")
        dx, dy, ha = _LABEL_SIDES[i % len(_LABEL_SIDES)]
        for v in vs:
            ax.annotate(_fmt_params(v.params), (v.heads[0], v.stats.mean), textcoords="offset points",
                        xytext=(dx, dy), ha=ha, fontsize=7, color=f"C{i}")
            rows2.append(dict(variant=v.name, n_layers=L, heads_per_layer=v.heads[0], head_dim=v.head_dims[0],
                              params=v.params, loss_mean=v.stats.mean, loss_sd=v.stats.std, seeds=v.stats.n))
    markers = iter("*DPXv^<>")
    for v in extra:
        ax.scatter([v.heads[0]], [v.stats.mean], marker=next(markers, "s"), s=90, color="k", zorder=4,
                   label=f"{v.name} ({_fmt_params(v.params)})")
        rows2.append(dict(variant=v.name, n_layers=v.n_layers, heads_per_layer=v.heads[0], head_dim=v.head_dims[0],
                          params=v.params, loss_mean=v.stats.mean, loss_sd=v.stats.std, seeds=v.stats.n))
    if base is not None and base.done:
        ax.axhline(base.stats.mean, color="0.4", ls=":", lw=1, label=f"baseline {base.name}")
    ax.set_xlabel("heads per layer")
    ax.xaxis.set_major_locator(FixedLocator(sorted({r["heads_per_layer"] for r in rows2})))
    ax.set_ylabel("final eval loss")
    ax.set_title("Final eval loss vs heads per layer, by depth (labels: parameters)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    doc.add("## Loss vs heads per layer, by depth")
    doc.figure("loss_vs_heads_by_depth", fig, rows2, "Final eval loss against heads per layer, one line per depth "
               "(the grid, at fixed head_dim); black markers are the other variants; the dotted line is the "
               "baseline, as in the paper's Figs. 3 and 5.")
    # loss vs parameters
    fig, axes = _new_figure(8.0, 5.0)
    ax = axes[0, 0]
    rows3 = []
    all_depths = sorted({v.n_layers for v in variants if v.done})
    for i, L in enumerate(all_depths):
        vs = [v for v in variants if v.done and v.n_layers == L]
        ax.scatter([v.params / 1e6 for v in vs], [v.stats.mean for v in vs], color=f"C{i}", label=f"{L} layers")
        for v in vs:
            ax.annotate(f"{v.heads[0]}h" + ("" if v in grid else f" {v.name}"), (v.params / 1e6, v.stats.mean),
                        textcoords="offset points", xytext=(4, 3), fontsize=7)
            rows3.append(dict(variant=v.name, n_layers=L, heads_per_layer=v.heads[0], params=v.params,
                              loss_mean=v.stats.mean))
    ax.set_xlabel("parameters (millions)")
    ax.set_ylabel("final eval loss")
    ax.set_title("Final eval loss vs parameters (labels: heads per layer)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    doc.figure("loss_vs_params", fig, rows3, "Final eval loss against parameters: trading depth for heads moves "
               "left (fewer parameters); lower is better.")
    if base is not None and base.done:
        comps = [(v, base, stats.compare(v.name, v.losses, base.name, base.losses))
                 for v in variants if v is not base and v.done and (v.name in names)]
        findings += _comparison_table(doc, record, comps, f"the baseline `{base.name}`", summarize=False)
    return findings


# --------------------------------------------------------------------------- rank (Amsel et al.)


@dataclass
class _RankPoint:
    v: Variant
    d: int
    layers: int
    heads: int
    rank: int
    n: int
    baseline: float

    @property
    def width(self) -> float:
        return self.heads * self.rank / self.d


def _rank_points(variants: list[Variant]) -> list[_RankPoint]:
    from headwise.tasks.nearest import baseline_loss

    pts = []
    for v in variants:
        run = v.info
        if run is None or not v.done or not v.heads:
            continue
        d = int(run.model.get("d_model"))
        n = int(run.task.get("n_points", 0))
        variant = run.task.get("variant", "farthest")
        pts.append(_RankPoint(v, d, v.n_layers, v.heads[0], v.head_dims[0], n, baseline_loss(d, n, variant)))
    return pts


def _pick_accuracy(v: Variant) -> float | None:
    """Share of held-out tokens whose output is closest to the right point (first eval batch)."""
    from headwise.tasks.config import build_task, parse_task_config
    from headwise.train.generate import load_run_model, vector_predictions

    run = v.done[0]
    try:
        model, _ = load_run_model(run.path)
        batch = build_task(parse_task_config(run.task)).eval_batches()[0]
        return float(vector_predictions(model, batch.inputs, batch.targets)["accuracy"])
    except HeadwiseError:
        return None


def _rank_section(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> list[str]:
    findings: list[str] = []
    pts = _rank_points(variants)
    if not pts:
        doc.add("No completed nearest-neighbour runs to plot.")
        return findings
    main_n = Counter(p.n for p in pts).most_common(1)[0][0]
    d = pts[0].d
    doc.add("## Error vs rank per head",
            f"Final eval error (mean squared distance to the target point) on the nearest-neighbour task at d = {d}, "
            f"N = {main_n} points. Width w is the number of d-dimensional multi-head blocks (heads x rank / d): w = 1 "
            "is the standard head_dim = d / heads. \"Learned nothing\" is the best prediction of the form -c x_i "
            "(predicting 0 scores 1).")
    layers = sorted({p.layers for p in pts if p.n == main_n})
    widths = sorted({p.width for p in pts if p.n == main_n})
    fig, axes = _new_figure(4.2 * len(layers) + 0.8, 4.6, ncols=len(layers), sharey=True)
    rows = []
    for j, L in enumerate(layers):
        ax = axes[0, j]
        sel = [p for p in pts if p.n == main_n and p.layers == L]
        for i, w in enumerate(widths):
            line = sorted((p for p in sel if p.width == w), key=lambda p: p.rank)
            if not line:
                continue
            label = "heads = d / rank" if w == 1 else f"heads = {w:g} d / rank"
            ax.plot([p.rank for p in line], [p.v.stats.mean for p in line], marker="o", color=f"C{i}", label=label)
            for p in line:
                ax.annotate(f"{p.heads}h", (p.rank, p.v.stats.mean), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=f"C{i}")
                rows.append(dict(variant=p.v.name, layers=L, rank=p.rank, heads=p.heads, width=w, n_points=p.n,
                                 d=p.d, loss=p.v.stats.mean, learned_nothing=p.baseline))
        ax.axhline(sel[0].baseline, color="k", ls="--", lw=1, label="learned nothing")
        ax.axhline(0, color="0.6", lw=0.6)
        _log2_ticks(ax, [p.rank for p in sel])
        ax.set_xlabel("rank per head (head_dim)")
        ax.set_title(f"{L} layer{'s' if L > 1 else ''}")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("final eval error")
    axes[0, 0].legend(fontsize=8, loc="center left")
    doc.figure("error_vs_rank", fig, rows, f"Error against rank per head for each width and depth (d = {d}, "
               f"N = {main_n}); labels give the heads per layer; dashed: the learned-nothing level, as in Amsel et "
               "al.'s Fig. 1.")
    for L in layers:
        full = next((p for p in pts if p.n == main_n and p.layers == L and p.heads == 1 and p.rank == d), None)
        low = [p for p in pts if p.n == main_n and p.layers == L and p.rank < d and p.width == 1]
        if full and low:
            worst = min(low, key=lambda p: p.rank)
            text = (f"{_n(L, 'layer')}, N = {main_n}: one full-rank head (rank {d}) reaches error {full.v.stats.mean:.3f}; "
                    f"{worst.heads} heads of rank {worst.rank} (the standard head_dim = d / heads) reach "
                    f"{worst.v.stats.mean:.3f}")
            wider = [p for p in pts if p.n == main_n and p.layers == L and p.rank == worst.rank and p.width > 1]
            if wider:
                best = min(wider, key=lambda p: p.v.stats.mean)
                text += f", and {best.heads} heads of rank {worst.rank} reach {best.v.stats.mean:.3f}"
            findings.append(text + f"; learned nothing: {full.baseline:.3f}.")
    # error vs sequence length
    shapes = defaultdict(set)
    for p in pts:
        shapes[(p.rank, p.heads)].add(p.n)
    multi = [s for s, ns in shapes.items() if len(ns) > 1]
    if multi:
        doc.add("## Error vs sequence length")
        fig, axes = _new_figure(10.0, 5.0)
        ax = axes[0, 0]
        rows2 = []
        styles = ["-", "--", ":", "-."]
        layer_set = sorted({p.layers for p in pts if (p.rank, p.heads) in multi})
        for i, (r, h) in enumerate(sorted(multi, key=lambda s: -s[0])):
            for k, L in enumerate(layer_set):
                line = sorted((p for p in pts if (p.rank, p.heads) == (r, h) and p.layers == L), key=lambda p: p.n)
                if not line:
                    continue
                ax.plot([p.n for p in line], [p.v.stats.mean for p in line], marker="o", color=f"C{i}",
                        ls=styles[k % len(styles)], label=f"{_n(h, 'head')} of rank {r}, {_n(L, 'layer')}")
                rows2 += [dict(variant=p.v.name, layers=L, rank=r, heads=h, n_points=p.n, loss=p.v.stats.mean,
                               learned_nothing=p.baseline) for p in line]
        ns = sorted({p.n for p in pts if (p.rank, p.heads) in multi})
        base_line = {p.n: p.baseline for p in pts}
        ax.plot(ns, [base_line[n] for n in ns], color="k", ls="--", lw=1, label="learned nothing")
        ax.axhline(0, color="0.6", lw=0.6)
        _log2_ticks(ax, ns)
        ax.set_xlabel("points per sample N (sequence length)")
        ax.set_ylabel("final eval error")
        ax.set_title(f"Error vs sequence length (d = {d})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        doc.figure("error_vs_seqlen", fig, rows2, "Error against the number of points for a full-rank head and for "
                   "low-rank heads, by depth; dashed: the learned-nothing level at each N.")
        for L in layer_set:
            for (r, h) in sorted(multi, key=lambda s: -s[0]):
                line = sorted((p for p in pts if (p.rank, p.heads) == (r, h) and p.layers == L), key=lambda p: p.n)
                if len(line) > 1:
                    findings.append(f"{_n(h, 'head')} of rank {r}, {_n(L, 'layer')}: error "
                                    + ", ".join(f"{p.v.stats.mean:.3f} at N={p.n}" for p in line)
                                    + " (learned nothing: " + ", ".join(f"{p.baseline:.3f}" for p in line) + ").")
    # table
    doc.add("## Rank table", "Pick accuracy: the share of held-out tokens whose output is closest to the right "
            "point (first evaluation batch, seed 0).")
    lr = {p.v.name: p.v.done[0].config.get("optim", {}).get("lr") for p in pts}
    show_lr = len(set(lr.values())) > 1  # e.g. deeper models trained at a lower rate
    trows = []
    for p in sorted(pts, key=lambda p: (p.n, p.layers, p.width, p.rank)):
        acc = _pick_accuracy(p.v)
        trows.append([f"`{p.v.name}`", p.layers, p.heads, p.rank, f"{p.width:g}", p.n]
                     + ([lr[p.v.name]] if show_lr else [])
                     + [_fmt_params(p.v.params), _loss_cell(p.v), f"{p.baseline:.3f}", _fmt(acc, 3)])
    doc.table(["variant", "layers", "heads", "rank", "width", "N"] + (["lr"] if show_lr else [])
              + ["params", "final error", "learned nothing", "pick accuracy"], trows)
    if record.seeds < 2:
        doc.add("**Each configuration was trained with one seed, so no claim can be made about whether "
                "the differences exceed seed-to-seed noise; rerun with `--seeds 3` to test them.**")
    return findings


# --------------------------------------------------------------------------- common sections


def _color_key(record: StudyRecord, v: Variant) -> str:
    kind = record.report.kind
    if kind == "heads":
        return _series_of(record, v)
    if kind == "depth":  # the grid by depth; variants outside it on their own
        return f"{v.n_layers} layers" if "layers" in v.labels else v.name
    run = v.info
    return f"{_n(v.n_layers or 0, 'layer')}, N = {run.task.get('n_points') if run else '?'}"


def _time_section(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> None:
    done = [v for v in variants if v.done and v.total_heads]
    keys = list(dict.fromkeys(_color_key(record, v) for v in done))
    fig, axes = _new_figure(11.0, 4.4, ncols=2)
    rows = []
    for i, k in enumerate(keys):
        vs = sorted((v for v in done if _color_key(record, v) == k), key=lambda v: v.total_heads)
        x = [v.total_heads for v in vs]
        # a line only where it joins one point per total (else it would zig-zag between variants)
        ls = "-" if len(set(x)) == len(x) else "none"
        axes[0, 0].plot(x, [v.mean("train_time_s") for v in vs], marker="o", ls=ls, color=f"C{i % 10}", label=k)
        axes[0, 1].plot(x, [v.mean("tokens_per_s") for v in vs], marker="o", ls=ls, color=f"C{i % 10}", label=k)
        rows += [dict(variant=v.name, group=k, total_heads=v.total_heads, params=v.params,
                      train_time_s=v.mean("train_time_s"), wall_time_s=v.mean("wall_time_s"),
                      tokens_per_s=v.mean("tokens_per_s")) for v in vs]
    axes[0, 0].set_ylabel("training time (s)")
    axes[0, 1].set_ylabel("training throughput (tokens/s)")
    for ax in axes[0]:
        ax.set_xlabel("total attention heads")
        ax.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=8, ncols=2 if len(keys) > 6 else 1)
    fig.suptitle("Training time and throughput vs heads")
    doc.add("## Training time and throughput")
    doc.figure("time_vs_heads", fig, rows, "Training time (excluding evaluation and checkpoints) and tokens per "
               "second against total heads. On a shared CPU these timings include other processes' load.")


def _curve_panel(record: StudyRecord, v: Variant) -> str:
    kind = record.report.kind
    if kind == "heads":
        axis = record.report.series
        g = [f"{k} {lab}" for k, lab in v.labels.items() if k != axis]
        return ", ".join(g) if g else "all runs"
    if kind == "depth":
        return f"{v.n_layers} layers"
    run = v.info
    n = run.task.get("n_points") if run else "?"
    return f"{_n(v.n_layers or 0, 'layer')}, N = {n}"


def _curves_section(doc: _Doc, record: StudyRecord, variants: list[Variant]) -> None:
    curves: dict[str, list[tuple[Variant, list[float], list[float]]]] = defaultdict(list)
    rows = []
    for v in variants:
        if not v.done:
            continue
        per_step: dict[int, list[float]] = defaultdict(list)
        for run in v.done:
            for m in run.metrics():
                if isinstance(m.get("eval_loss"), (int, float)):
                    per_step[int(m["step"])].append(float(m["eval_loss"]))
                    rows.append(dict(variant=v.name, seed=run.seed, step=m["step"], tokens=m.get("tokens"),
                                     eval_loss=m["eval_loss"]))
        steps = sorted(s for s, vals in per_step.items() if len(vals) == len(v.done))
        if steps:
            curves[_curve_panel(record, v)].append((v, steps, [float(np.mean(per_step[s])) for s in steps]))
    if not curves:
        return
    # panels in order of depth (then sequence length) for depth and rank studies
    first = {title: members[0][0] for title, members in curves.items()}
    panels = list(curves) if record.report.kind == "heads" else sorted(
        curves, key=lambda t: (first[t].n_layers or 0, (first[t].info.task.get("n_points", 0) if first[t].info else 0)))
    crowded = max(len(m) for m in curves.values()) > 4  # then legends go beside the panels
    ncols = min(2 if crowded else 3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = _new_figure((6.6 if crowded else 4.6) * ncols, 3.6 * nrows, ncols=ncols, nrows=nrows)
    for k, title in enumerate(panels):
        ax = axes[k // ncols, k % ncols]
        for i, (v, steps, losses) in enumerate(curves[title]):
            ax.plot(steps, losses, color=f"C{i % 10}", lw=1.3, label=v.name)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel("eval loss")
        ax.grid(alpha=0.3)
        if crowded:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        else:
            ax.legend(fontsize=7)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols, k % ncols].set_visible(False)
    fig.suptitle("Eval loss during training" + (" (mean over seeds)" if record.seeds > 1 else ""))
    doc.add("## Eval loss during training")
    doc.figure("eval_curves", fig, rows, "Eval loss on the fixed held-out set against training step, one panel per "
               "group of variants.")


#: Sequences of the first evaluation batch on which the final models' conditioning is measured.
COND_SEQUENCES = 8


class _Cache:
    """Values computed from a run's final weights (conditioning, samples), kept in the report
    directory and reused while the weights and the settings are unchanged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def stamp(run: Run, settings: Any) -> str:
        weights = run.path / "model" / "model.safetensors"
        mtime = weights.stat().st_mtime_ns if weights.is_file() else 0
        return json.dumps([mtime, settings], sort_keys=True)

    def get(self, kind: str, run: Run, settings: Any) -> Any:
        entry = self.data.get(f"{kind}:{run.path}")
        return entry["value"] if entry and entry.get("stamp") == self.stamp(run, settings) else None

    def put(self, kind: str, run: Run, settings: Any, value: Any) -> None:
        self.data[f"{kind}:{run.path}"] = {"stamp": self.stamp(run, settings), "value": value}
        atomic_write_text(self.path, json.dumps(self.data, indent=1))


def _condition_of(run: Run, cache: _Cache) -> dict[str, float] | None:
    from headwise.analysis.conditioning import analyze_model
    from headwise.analysis.runs import eval_inputs
    from headwise.model import load_pretrained

    cached = cache.get("cond", run, COND_SEQUENCES)
    if cached is not None:
        return cached
    if not (run.path / "model").is_dir():
        return None
    inputs = eval_inputs(run.path, 1)[0][:COND_SEQUENCES]
    result = analyze_model(load_pretrained(run.path / "model"), [inputs])
    value = {"cond_mean": result.cond_mean, "cond_median": result.cond_median,
             "rank_deficient": result.rows()[-1]["rank_deficient"]}
    cache.put("cond", run, COND_SEQUENCES, value)
    return value


def _conditioning_section(doc: _Doc, record: StudyRecord, variants: list[Variant], enabled: bool,
                          cache: _Cache) -> None:
    doc.add("## Conditioning vs heads")
    if not enabled:
        doc.add("Not computed for this report (`--no-conditioning`): run `headwise report` without it, or "
                f"`headwise analyze {record.path}` for the full analysis.")
        return
    if importlib.util.find_spec("headwise.analysis") is None:
        doc.add("Needs `headwise analyze`: this installation has no analysis module.")
        return
    depth = record.report.kind == "depth"
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    out = []
    infinite: list[str] = []
    for v in variants:
        for run in v.done:
            try:
                c = _condition_of(run, cache)
            except HeadwiseError as exc:
                doc.add(f"`{v.name}` seed {run.seed}: not measured ({exc}).")
                continue
            if c is None:
                continue
            if not math.isfinite(c["cond_mean"]):
                infinite.append(f"`{v.name}`")
                continue
            x = v.heads[0] if depth else v.total_heads
            groups[_color_key(record, v)].append((x, c["cond_mean"]))
            out.append(dict(variant=v.name, seed=run.seed, group=_color_key(record, v), heads_per_layer=v.heads[0],
                            total_heads=v.total_heads, **c))
    if not out:
        doc.add(f"No final model could be measured; `headwise analyze {record.path}` analyses checkpoints too.")
        return
    fig, axes = _new_figure(8.0, 4.8)
    ax = axes[0, 0]
    for i, (k, pts) in enumerate(groups.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i % 10}", label=k)
    ax.set_yscale("log")
    ax.set_xlabel("heads per layer" if depth else "total attention heads")
    ax.set_ylabel("condition number of A (mean over layers)")
    ax.set_title("Attention-output conditioning of the final models")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    doc.add("The condition number sigma_max / sigma_min of each layer's concatenated per-head attention output "
            "A = [A_1 ... A_h] (tokens x attention width, before the output projection), averaged over the first "
            f"{COND_SEQUENCES} sequences of the first evaluation batch and over layers (Leaner Transformers' Fig. 2 "
            "quantity), measured in float64 on the final weights with `headwise.analysis.conditioning.analyze_model`. "
            f"`headwise analyze {record.path}` gives the same over all checkpoints and more sequences.")
    doc.figure("conditioning_vs_heads", fig, out, "Mean condition number of the attention output against "
               + ("heads per layer, one line per depth." if depth else "total heads."))
    if infinite:
        doc.add(f"Not drawn: {', '.join(infinite)}, where some layer's A is rank deficient on these sequences "
                "(condition number reported as infinite by the analysis).")


def _sample(run: Run, spec: Any, cache: _Cache, untrained: bool = False) -> str:
    from headwise.train.generate import generate_text

    kind = "sample-untrained" if untrained else "sample"
    settings = [spec.prompt, spec.temperature, spec.sample_tokens]
    text = cache.get(kind, run, settings)
    if text is None:
        text, _ = generate_text(run.path, spec.prompt, spec.sample_tokens, temperature=spec.temperature, seed=0,
                                untrained=untrained)
        cache.put(kind, run, settings, text)
    return text


def _samples_section(doc: _Doc, record: StudyRecord, variants: list[Variant], cache: _Cache) -> None:
    done = [v for v in variants if v.done]
    if not done or done[0].done[0].task.get("kind", "lm") != "lm":
        return
    spec = record.report
    doc.add("## Samples",
            f"Prompt \"{spec.prompt}\", temperature {spec.temperature}, up to {spec.sample_tokens} new tokens "
            "(stopping at end-of-text), sampling seed 0, from seed 0 of each variant.")
    try:
        text = _sample(done[0].done[0], spec, cache, untrained=True)
        doc.add(f"**Untrained** (a fresh initialisation of `{done[0].name}`):", _quote(spec.prompt + text))
    except HeadwiseError as exc:
        doc.add(f"Untrained sample unavailable: {exc}")
    for v in done:
        try:
            text = _sample(v.done[0], spec, cache)
        except HeadwiseError as exc:
            doc.add(f"`{v.name}`: no sample ({exc})")
            continue
        doc.add(f"**`{v.name}`** (final eval loss {v.stats.mean:.4f}):", _quote(spec.prompt + text))


def _quote(text: str) -> str:
    return "\n".join("> " + line if line.strip() else ">" for line in text.strip().splitlines())


def _reproduce(doc: _Doc, record: StudyRecord) -> None:
    study = record.name if record.source.startswith("builtin:") else record.source
    preset = f" --preset {record.preset}" if record.preset else ""
    doc.add("## Reproduce",
            "```",
            f"headwise study {study}{preset} --seeds {record.seeds} --out {record.path}",
            f"headwise report {record.path}",
            "```",
            "The resolved study is in `study.toml`, each run's input config in `configs/` and its resolved config in "
            "`runs/VARIANT/seedK/config.toml`.")

