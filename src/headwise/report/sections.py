"""The sections every report has, whatever its layout: the header, the table of all runs,
training time and throughput, eval-loss curves, conditioning of the final models, samples, and
how to reproduce the study. A layout decides only how variants are grouped and labelled
(:class:`headwise.report.registry.Layout`). What the layouts that compare variants against a
baseline share is here too: :func:`comparison_table`, the headline and full tables of
:func:`baseline_tables`, and their cells (:func:`seed_cell`, :func:`params_cell`,
:func:`memory_cell`, :func:`statuses`, :func:`noise_verdict`).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from typing import Any, Callable

import numpy as np

from headwise.errors import HeadwiseError
from headwise.report import stats
from headwise.report.data import RunRecord, StudyRuns, VariantRuns
from headwise.report.document import (Document, finish, fixed_ticks, fmt, fmt_p, fmt_params, heads_str, new_figure,
                                      plural, quote)
from headwise.report.probes import COND_SEQUENCES, Probes
from headwise.report.options import ReportSpec
from headwise.report.paper import BaselineOptions
from headwise.report.registry import Layout
from headwise.study.layout import RESULTS_CSV

#: Significance level of the Holm-corrected Welch tests.
ALPHA = 0.05


def seed_cell(s: stats.SeedStats, digits: int = 4) -> str:
    """A value over seeds (a final eval loss by default): the value with one seed, mean ± sd (n)
    with several, "–" with none."""
    if s.n == 0:
        return "–"
    return f"{s.mean:.{digits}f}" if s.n == 1 else f"{s.mean:.{digits}f} ± {s.std:.{digits}f} (n={s.n})"


def statuses(v: VariantRuns) -> str:
    """The variant's runs by status: ``2 completed, 1 failed``."""
    return ", ".join(f"{n} {s}" for s, n in Counter(r.status.value for r in v.runs).items())


def noise_verdict(c: stats.Comparison) -> str:
    """A comparison's cell in a seed-noise table."""
    if not c.testable:
        return "no claim (needs >= 2 seeds each)"
    return "distinguishable from seed noise" if c.p_holm < ALPHA else "within seed noise"


def missing_baseline_note(doc: Document, baseline: str | None, base: VariantRuns | None) -> None:
    """Say so when the ``[report]`` names a baseline (``baseline``) that is not among the variants
    (``base`` None)."""
    if baseline is not None and base is None:
        doc.add(f"**The baseline `{baseline}` named in the study's `[report]` is not one of its variants**, "
                "so nothing is compared against it.")


def cpu_memory_note(doc: Document, run: RunRecord | None) -> None:
    """The caveat on peak memory when the reference ``run`` trained on the CPU."""
    if run is not None and run.summary is not None and run.summary.device.startswith("cpu"):
        doc.add("On CPU, peak memory is the resident memory of the whole training process, most of it the Python "
                "and PyTorch runtime, so its differences understate those of the models themselves.")


def params_cell(v: VariantRuns, base: VariantRuns | None, digits: int = 0) -> str:
    """A variant's parameters and, in parentheses, their difference from ``base``'s in percent
    (``digits`` decimals), where ``base`` (another variant, or None) and both counts are known."""
    cell = fmt_params(v.params)
    if base is not None and v.params and base.params:
        cell += f" ({stats.percent_difference(v.params, base.params):+.{digits}f}%)"
    return cell


def memory_cell(v: VariantRuns, base: VariantRuns | None = None) -> str:
    """A variant's peak training memory ("–" unmeasured) and, given ``base`` (another variant)
    that has one, the difference from it in percent."""
    if not v.peak_mb:
        return "–"
    cell = fmt(v.peak_mb, 0) + " MiB"
    if base is not None and base.peak_mb:
        cell += f" ({stats.percent_difference(v.peak_mb, base.peak_mb):+.0f}%)"
    return cell


def baseline_tables(doc: Document, opts: BaselineOptions, base: VariantRuns | None, study: StudyRuns,
                    headers: list[str], row: Callable[[VariantRuns], list[str]]) -> list[str]:
    """The tables of a layout that sets variants against a baseline (``base``, the variant
    ``opts.baseline`` names, or None): the headline rows ``opts.table`` names, then every
    variant's, each row ``row(v)``; with the notes on a missing baseline and on memory measured on
    the CPU. Returns the names of the headline rows (those among the variants)."""
    missing_baseline_note(doc, opts.baseline, base)
    by_name = {v.name: v for v in study.variants}
    names = [n for n in (opts.table or []) if n in by_name]
    if names:
        doc.table(headers, [row(by_name[n]) for n in names])
    doc.add("Every variant:")
    doc.table(headers, [row(v) for v in study.variants])
    cpu_memory_note(doc, base.info if base is not None else None)
    return names


def header(doc: Document, study: StudyRuns) -> None:
    """Title, description, preset, run counts and the setup of the first completed run."""
    record = study.record
    counts = Counter(r.status.value for v in study.variants for r in v.runs)
    status = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    title = f"# Study `{record.name}`" + (f" (preset `{record.preset}`)" if record.preset else "")
    lines = [title, record.description]
    if record.preset_summary:
        lines += ["", f"Preset `{record.preset}`: {record.preset_summary}."]
    lines += ["", f"{len(study.variants)} variants x {plural(record.seeds, 'seed')}: {status}. "
                  f"Study directory `{record.path}`; generated {time.strftime('%Y-%m-%d %H:%M')}."]
    first = next((r for v in study.variants for r in v.done), None)
    if first is not None:
        lines += ["", f"Setup (from `{first.path.relative_to(record.path)}`): {_describe_setup(first)}."]
    doc.add(*lines)


def _describe_setup(run: RunRecord) -> str:
    """One line on the task, model size and training of a run."""
    s = run.summary
    assert s is not None  # a completed run has its summary
    what = run.task.setup_line(s.task) if run.task is not None else "an unreadable task config"
    d_model = s.d_model or run.config.get("model", {}).get("d_model")
    return (f"{what}; d_model {d_model}; {s.steps} steps of {s.tokens_per_step} {s.unit} ({s.tokens} in all), "
            f"AdamW lr {run.lr}, {s.precision} on {s.device}")


def results_table(doc: Document, study: StudyRuns) -> None:
    """Every variant: shape, size, memory, loss, time, throughput and run statuses."""
    # results.csv is the study runner's (kept up to date as runs finish): linked, never written here
    per_run = " Per-run rows: [results.csv](../results.csv)." if (study.record.path / RESULTS_CSV).is_file() else ""
    speed = f"{study.unit}/s"
    doc.add("## All runs", "Final eval loss is the mean over seeds ± the sample standard deviation; "
            f"times and {speed} are means over completed seeds; peak memory is CUDA max allocated on a GPU, "
            "peak resident memory of the process on CPU." + per_run)
    doc.table(["variant", "heads per layer", "total heads", "head_dim", "params", "peak memory (MiB)",
               "final eval loss", "train time (s)", speed, "runs"],
              [[f"`{v.name}`", heads_str(v.heads), fmt(v.total_heads), heads_str(v.head_dims), fmt_params(v.params),
                fmt(v.peak_mb, 0), seed_cell(v.stats), fmt(v.mean("train_time_s"), 1), fmt(v.mean("tokens_per_s"), 0),
                statuses(v)] for v in study.variants])


def comparison_table(doc: Document, seeds: int, comps: list[tuple[VariantRuns, VariantRuns, stats.Comparison]],
                     against: str, summarize: bool = True) -> list[str]:
    """Each variant against its baseline: difference, Welch's t-test and Holm's correction;
    returns the findings (the differences when ``summarize``, and what can be claimed)."""
    doc.add("## Differences and seed noise")
    if not comps:
        doc.add("No completed pairs to compare.")
        return []
    stats.apply_holm([c for _, _, c in comps])
    findings = ["Measured final eval loss: " + "; ".join(
        f"`{v.name}` {c.percent:+.2f}% vs `{ref.name}` ({v.stats.mean:.4f} vs {ref.stats.mean:.4f})"
        for v, ref, c in comps) + "."] if summarize else []
    rows = [[f"`{v.name}`", f"`{ref.name}`", seed_cell(v.stats), seed_cell(ref.stats), f"{c.percent:+.2f}%",
             fmt(c.t, 2), fmt_p(c.p), fmt_p(c.p_holm), noise_verdict(c)] for v, ref, c in comps]
    doc.add(f"Each variant against {against}: the difference of mean final eval loss (negative = lower = better), "
            "and Welch's unequal-variance t-test across seeds (two-sided, `scipy.stats.ttest_ind(equal_var=False)`), "
            f"with Holm's correction over the {len(comps)} comparisons; distinguishable means Holm-adjusted p < {ALPHA}.")
    doc.table(["variant", "baseline", "loss", "baseline loss", "difference", "Welch t", "p", "p (Holm)", "verdict"],
              rows)
    if not any(c.testable for _, _, c in comps):
        what = "one seed" if seeds == 1 else f"{seeds} seeds"
        text = (f"Each configuration was trained with {what}, so no claim can be made about whether "
                "these differences exceed seed-to-seed noise; rerun with `--seeds 3` (or more) to test them.")
        doc.add(f"**{text}**")
        findings.append(text)
    else:
        sig = [c.name for _, _, c in comps if c.testable and c.p_holm < ALPHA]
        findings.append(f"With {seeds} seeds, {len(sig)} of {len(comps)} differences from the baseline are "
                        f"distinguishable from seed noise (Welch's t-test, Holm-corrected, alpha {ALPHA})"
                        + (f": {', '.join(sig)}" if sig else "") + ".")
    return findings


def time_section(doc: Document, study: StudyRuns, layout: Layout) -> None:
    """Training time and throughput (tokens/s, images/s) against total heads, one colour per layout group."""
    done = [v for v in study.done if v.total_heads]
    keys = list(dict.fromkeys(layout.group(v) for v in done))
    fig, axes = new_figure(11.0, 4.4, ncols=2)
    rows = []
    for i, k in enumerate(keys):
        vs = sorted((v for v in done if layout.group(v) == k), key=lambda v: v.total_heads)
        x = [v.total_heads for v in vs]
        # a line only where it joins one point per total (else it would zig-zag between variants)
        ls = "-" if len(set(x)) == len(x) else "none"
        axes[0, 0].plot(x, [v.mean("train_time_s") for v in vs], marker="o", ls=ls, color=f"C{i % 10}", label=k)
        axes[0, 1].plot(x, [v.mean("tokens_per_s") for v in vs], marker="o", ls=ls, color=f"C{i % 10}", label=k)
        rows += [dict(variant=v.name, group=k, total_heads=v.total_heads, params=v.params,
                      train_time_s=v.mean("train_time_s"), wall_time_s=v.mean("wall_time_s"),
                      tokens_per_s=v.mean("tokens_per_s")) for v in vs]
    axes[0, 0].set_ylabel("training time (s)")
    axes[0, 1].set_ylabel(f"training throughput ({study.unit}/s)")
    for ax in axes[0]:
        finish(ax, "total attention heads", legend=None)
    axes[0, 1].legend(fontsize=8, ncols=2 if len(keys) > 6 else 1)
    fig.suptitle("Training time and throughput vs heads")
    doc.add("## Training time and throughput")
    doc.figure("time_vs_heads", fig, rows, f"Training time (excluding evaluation and checkpoints) and {study.unit} per "
               "second against total heads. On a shared CPU these timings include other processes' load.")


def _mean_curves(study: StudyRuns, layout: Layout) -> tuple[dict[str, list[tuple[VariantRuns, list[int], list[float]]]],
                                                            list[dict[str, Any]]]:
    """Per layout panel, each variant's eval loss by step (mean over its completed seeds, at the
    steps every seed logged), and the per-seed rows behind them."""
    curves: dict[str, list[tuple[VariantRuns, list[int], list[float]]]] = defaultdict(list)
    rows = []
    for v in study.done:
        per_step: dict[int, list[float]] = defaultdict(list)
        for run in v.done:
            for m in run.metrics():
                if isinstance(m.get("eval_loss"), (int, float)):
                    per_step[int(m["step"])].append(float(m["eval_loss"]))
                    rows.append(dict(variant=v.name, seed=run.seed, step=m["step"], tokens=m.get("tokens"),
                                     eval_loss=m["eval_loss"]))
        steps = sorted(s for s, vals in per_step.items() if len(vals) == len(v.done))
        if steps:
            curves[layout.panel(v)].append((v, steps, [float(np.mean(per_step[s])) for s in steps]))
    return curves, rows


def curves_section(doc: Document, study: StudyRuns, layout: Layout) -> None:
    """Eval loss during training, one panel per layout panel."""
    curves, rows = _mean_curves(study, layout)
    if not curves:
        return
    panels = layout.panel_order({title: members[0][0] for title, members in curves.items()})
    crowded = max(len(m) for m in curves.values()) > 4  # then legends go beside the panels
    ncols = min(2 if crowded else 3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = new_figure((6.6 if crowded else 4.6) * ncols, 3.6 * nrows, ncols=ncols, nrows=nrows)
    for k, title in enumerate(panels):
        ax = axes[k // ncols, k % ncols]
        for i, (v, steps, losses) in enumerate(curves[title]):
            ax.plot(steps, losses, color=f"C{i % 10}", lw=1.3, label=v.name)
        ax.set_title(title, fontsize=10)
        finish(ax, "training step", "eval loss", legend=None if crowded else 7)
        if crowded:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols, k % ncols].set_visible(False)
    fig.suptitle("Eval loss during training" + (" (mean over seeds)" if study.record.seeds > 1 else ""))
    doc.add("## Eval loss during training")
    doc.figure("eval_curves", fig, rows, "Eval loss on the fixed held-out set against training step, one panel per "
               "group of variants.")


def _measure_conditioning(doc: Document, study: StudyRuns, layout: Layout, probes: Probes
                          ) -> tuple[dict[str, list[tuple[float, float]]], list[dict[str, Any]], list[str]]:
    """Each completed run's final-model conditioning: points per layout group, the CSV rows, and
    the variants left out as rank deficient."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    rows: list[dict[str, Any]] = []
    infinite: list[str] = []
    for v in study.done:
        for run in v.done:
            try:
                c = probes.conditioning(run)
            except HeadwiseError as exc:
                doc.add(f"`{v.name}` seed {run.seed}: not measured ({exc}).")
                continue
            if c is None:
                continue
            if not math.isfinite(c["cond_mean"]):
                infinite.append(f"`{v.name}`")
                continue
            groups[layout.group(v)].append((layout.conditioning_x(v), c["cond_mean"]))
            rows.append(dict(variant=v.name, seed=run.seed, group=layout.group(v), heads_per_layer=v.heads[0],
                             total_heads=v.total_heads, **c))
    return groups, rows, infinite


def conditioning_section(doc: Document, study: StudyRuns, layout: Layout, probes: Probes, enabled: bool) -> None:
    """Condition number of the final models' attention output against heads."""
    path = study.record.path
    doc.add("## Conditioning vs heads")
    if not enabled:
        doc.add("Not computed for this report (`--no-conditioning`): run `headwise report` without it, or "
                f"`headwise analyze {path}` for the full analysis.")
        return
    groups, rows, infinite = _measure_conditioning(doc, study, layout, probes)
    if not rows:
        doc.add(f"No final model could be measured; `headwise analyze {path}` analyses checkpoints too.")
        return
    fig, axes = new_figure(8.0, 4.8)
    ax = axes[0, 0]
    for i, (k, pts) in enumerate(groups.items()):
        # each run a dot, the line through the mean over seeds at each x (not through every seed's dot)
        by_x: dict[float, list[float]] = defaultdict(list)
        for x, y in pts:
            by_x[x].append(y)
        xs = sorted(by_x)
        ax.plot(xs, [float(np.mean(by_x[x])) for x in xs], marker="o", color=f"C{i % 10}", label=k)
        if any(len(ys) > 1 for ys in by_x.values()):
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=12, color=f"C{i % 10}", alpha=0.45)
    ax.set_yscale("log")
    fixed_ticks(ax, [x for pts in groups.values() for x, _ in pts])  # ticks at the heads measured
    finish(ax, layout.conditioning_label, "condition number of A (mean over layers)",
           "Attention-output conditioning of the final models")
    doc.add("The condition number sigma_max / sigma_min of each layer's concatenated per-head attention output "
            "A = [A_1 ... A_h] (tokens x attention width, before the output projection), averaged over the first "
            f"{COND_SEQUENCES} sequences of the first evaluation batch and over layers (Leaner Transformers' Fig. 2 "
            "quantity), measured in float64 on the final weights with `headwise.analysis.conditioning.analyze_model` (a "
            "timm model's through its own attention modules: `headwise.families.vision.timm_analysis`). "
            f"`headwise analyze {path}` gives the same over all checkpoints and more sequences.")
    doc.figure("conditioning_vs_heads", fig, rows, "Mean condition number of the attention output against "
               + layout.conditioning_caption + " (with several seeds: the line joins the means over seeds, the "
               "small dots are the runs).")
    if infinite:
        doc.add(f"Not drawn: {', '.join(infinite)}, where some layer's A is rank deficient on these sequences "
                "(condition number reported as infinite by the analysis).")


def samples_section(doc: Document, study: StudyRuns, spec: ReportSpec, probes: Probes,
                    echo: Callable[[str], None]) -> None:
    """Text from an untrained model and from seed 0 of each variant (tasks that generate text only)."""
    done = study.done
    if not done or not done[0].done[0].generates_text:
        return
    echo(f"report: samples from {len(done)} models")
    doc.add("## Samples",
            f"Prompt \"{spec.prompt}\", temperature {spec.temperature}, up to {spec.sample_tokens} new tokens "
            "(stopping at end-of-text), sampling seed 0, from seed 0 of each variant.")
    try:
        text = probes.sample(done[0].done[0], spec.prompt, spec.temperature, spec.sample_tokens, untrained=True)
        doc.add(f"**Untrained** (a fresh initialisation of `{done[0].name}`):", quote(spec.prompt + text))
    except HeadwiseError as exc:
        doc.add(f"Untrained sample unavailable: {exc}")
    for v in done:
        try:
            text = probes.sample(v.done[0], spec.prompt, spec.temperature, spec.sample_tokens)
        except HeadwiseError as exc:
            doc.add(f"`{v.name}`: no sample ({exc})")
            continue
        doc.add(f"**`{v.name}`** (final eval loss {v.stats.mean:.4f}):", quote(spec.prompt + text))


def reproduce(doc: Document, study: StudyRuns) -> None:
    """The commands that rerun the study and rewrite the report."""
    record = study.record
    name = record.name if record.source.startswith("builtin:") else record.source
    preset = f" --preset {record.preset}" if record.preset else ""
    doc.add("## Reproduce",
            "```",
            f"headwise study {name}{preset} --seeds {record.seeds} --out {record.path}",
            f"headwise report {record.path}",
            "```",
            "The resolved study is in `study.toml`, each run's input config in `configs/` and its resolved config in "
            "`runs/VARIANT/seedK/config.toml`.")
