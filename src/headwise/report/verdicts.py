"""The report's verdicts: each ``[[claims]]`` entry of the study tested on paired seeds.

For every comparison of a claim: the seeds both runs completed, the mean gain with its 95% t
interval, Cohen's d_z, the smallest gain those seeds detect, the one-sided p-value with Holm's
correction over the claim's comparisons, the verdict (:class:`~headwise.report.paired.Verdict`)
and the scale it was measured at beside the paper's. Whether the ranking had settled is read
from the eval curves: the sign of the mean paired gain over the last fifth of training.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headwise.report.data import RunRecord, StudyRuns, VariantRuns
from headwise.report.document import Document, fmt, fmt_p, fmt_params, new_figure
from headwise.report.paired import ALPHA, INTERVAL_METHOD, Judged, Verdict, judge, paired_gain, seeds_for
from headwise.run import RunStatus
from headwise.study.claims import Claim

#: the share of training, at its end, over which the ranking must hold
SETTLED_FRACTION = 0.2


def final_value(run: RunRecord, claim: Claim) -> float | None:
    """A completed run's final value of the claim's metric (x 100 with ``percent``)."""
    s = run.summary
    if run.status is not RunStatus.COMPLETED or s is None:
        return None
    value = s.final_eval_loss if claim.metric == "loss" else s.eval_metrics.get(claim.metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) * (100.0 if claim.percent else 1.0)


def by_seed(v: VariantRuns, claim: Claim) -> dict[int, float]:
    """Seed -> the final value of the claim's metric, for the variant's completed runs."""
    out = {}
    for run in v.runs:
        value = final_value(run, claim)
        if value is not None:
            out[run.seed] = value
    return out


def curve(run: RunRecord, claim: Claim) -> dict[int, float]:
    """Step -> the claim's metric at each evaluation of the run (x 100 with ``percent``)."""
    key = "eval_loss" if claim.metric == "loss" else f"eval_{claim.metric}"
    scale = 100.0 if claim.percent else 1.0
    return {int(row["step"]): float(row[key]) * scale for row in run.metrics()
            if isinstance(row.get(key), (int, float)) and "step" in row}


def settled(variant: VariantRuns, baseline: VariantRuns, claim: Claim, seeds: tuple[int, ...]) -> str:
    """Whether the sign of the mean paired gain held over the last fifth of training: "yes", or
    the step at which it last changed."""
    sign = 1.0 if claim.higher_is_better else -1.0
    gains: dict[int, list[float]] = defaultdict(list)
    runs_v = {r.seed: r for r in variant.runs}
    runs_b = {r.seed: r for r in baseline.runs}
    for seed in seeds:
        cv, cb = curve(runs_v[seed], claim), curve(runs_b[seed], claim)
        for step in cv.keys() & cb.keys():
            gains[step].append(sign * (cv[step] - cb[step]))
    steps = sorted(s for s, g in gains.items() if len(g) == len(seeds))
    if len(steps) < 2:
        return "unknown (too few evaluations)"
    last = steps[-1]
    window = [s for s in steps if s >= (1 - SETTLED_FRACTION) * last]
    final_sign = math.copysign(1.0, sum(gains[last]))
    changed = [s for s in window if math.copysign(1.0, sum(gains[s])) != final_sign]
    return "yes" if not changed else f"no: the ranking was reversed at step {max(changed)} of {last}"


@dataclass(frozen=True)
class Comparison:
    """One row of the verdict table."""

    claim: Claim
    variant: VariantRuns
    baseline: VariantRuns
    baseline_mean: float
    judged: Judged
    settled: str


def compare_claim(study: StudyRuns, claim: Claim) -> list[Comparison]:
    """The claim's comparisons (those whose variants have run), judged together."""
    variants = {v.name: v for v in study.variants}
    rows, base_means = [], []
    for name, base_name in claim.pairs:
        v, b = variants.get(name), variants.get(base_name)
        if v is None or b is None:
            continue
        base = by_seed(b, claim)
        gain = paired_gain(by_seed(v, claim), base, claim.higher_is_better)
        if gain.n > 0:
            rows.append((v, b, gain))
            base_means.append(sum(base[s] for s in gain.seeds) / gain.n)
    if not rows:
        return []
    # one margin and one paper effect per claim, from its first comparison's baseline
    margin = claim.margin_for(base_means[0])
    judged = judge([g for _, _, g in rows], margin=margin, paper_gain=claim.paper_gain_for(base_means[0]))
    return [Comparison(claim, v, b, m, j, settled(v, b, claim, g.seeds))
            for (v, b, g), m, j in zip(rows, base_means, judged)]


def _scale(c: Comparison) -> str:
    """The scale the comparison ran at: parameters, steps, data seen, and the data source."""
    run = c.baseline.info
    s = run.summary if run is not None else None
    if s is None:
        return "–"
    source = run.task.setup_line(s.task) if run.task is not None else ""  # type: ignore[union-attr]
    return (f"{fmt_params(c.variant.params)} vs {fmt_params(c.baseline.params)} params, {s.steps} steps, "
            f"{s.tokens:,} {s.unit}; {source}")


def _interval(c: Comparison) -> str:
    g = c.judged.gain
    if g.n < 2:
        return f"{fmt(g.mean)} (one seed)"
    pct = 100 * g.mean / abs(c.baseline_mean) if c.baseline_mean else math.nan
    return f"{fmt(g.mean)} [{fmt(g.low)}, {fmt(g.high)}] ({pct:+.2f}%)"


def verdict_section(doc: Document, study: StudyRuns, claims: list[Claim],
                    stages: Mapping[str, StudyRuns] | None = None) -> list[str]:
    """The verdict table, its figure and the scale notes; returns one finding per comparison.
    A claim on a stage (``claim.stage``) compares that stage's runs, from ``stages``."""
    stages = stages or {}
    comparisons = [c for claim in claims for c in compare_claim(stages[claim.stage] if claim.stage else study, claim)]
    doc.add("## Verdicts on the papers' claims",
            "Each comparison pairs the variant's and the baseline's runs seed by seed (seed s fixes the data "
            "order of both). *Gain* is the mean paired difference oriented so that a positive value favours the "
            f"variant, with its {INTERVAL_METHOD}; the test is one-sided at {ALPHA:.1%} (the level at which that "
            "interval excludes its bound) with Holm's correction over the comparisons of one claim. *as good* "
            "claims are non-inferiority tests: the interval must stay above minus the margin, which the study "
            "file declared before the runs. *detectable* is the smallest gain these seeds find with 80% power; "
            "*settled* says whether the ranking held over the last fifth of training.")
    if not comparisons:
        doc.add("No claim's variants have completed runs yet.")
        return []
    rows, findings = [], []
    for c in comparisons:
        claim, j, g = c.claim, c.judged, c.judged.gain
        margin = claim.margin_for(c.baseline_mean)
        test = "better" if margin is None else f"as good (margin {fmt(margin)})"
        verdict = str(j.verdict) + (f" ({j.note})" if j.note else "")
        rows.append([claim.name, f"`{c.variant.name}` vs `{c.baseline.name}`", claim.source or "–", test,
                     claim.label, g.n, _interval(c), fmt(g.effect_size, 2), fmt(g.detectable), fmt_p(j.p_holm),
                     verdict, c.settled])
        findings.append(f"{claim.name} (`{c.variant.name}` vs `{c.baseline.name}`, {g.n} paired seeds): gain "
                        f"{_interval(c)} in {claim.label}: **{j.verdict}**.")
        if margin is not None and g.n > 1 and g.half_width >= margin:
            need = seeds_for(margin, g.sd)
            findings.append(f"The interval of `{c.variant.name}` is wider than its margin ({fmt(g.half_width)} >= "
                            f"{fmt(margin)}): about {need or 'more than 1000'} seeds would narrow it below the margin "
                            "at this spread.")
        if c.settled.startswith("no"):
            findings.append(f"`{c.variant.name}` vs `{c.baseline.name}`: still moving ({c.settled}); train longer "
                            "before reading this verdict.")
    doc.table(["claim", "comparison", "source", "test", "metric", "n", "gain [95% CI] (% of baseline)", "d_z",
               "detectable", "p (Holm)", "verdict", "settled"], rows)
    scales = []
    for claim in claims:
        mine = next((c for c in comparisons if c.claim is claim), None)
        if mine is not None:
            scales.append(f"- {claim.name}: here {_scale(mine)}; the paper: {claim.paper_scale or 'not stated'}.")
    doc.add("Scale of each claim, here and in the paper:", *scales)
    _figure(doc, comparisons)
    return findings


def _figure(doc: Document, comparisons: list[Comparison]) -> None:
    """Each comparison's gain and interval as a share of its baseline, with the null, the margins
    and the papers' effects."""
    fig, axes = new_figure(height=1.2 + 0.45 * len(comparisons))
    ax = axes[0, 0]
    rows: list[dict[str, Any]] = []
    for y, c in enumerate(reversed(comparisons)):
        g, scale = c.judged.gain, 100 / abs(c.baseline_mean) if c.baseline_mean else math.nan
        color = {Verdict.REPRODUCED: "tab:green", Verdict.EQUIVALENT: "tab:green",
                 Verdict.CONTRADICTED: "tab:red"}.get(c.judged.verdict, "tab:gray")
        lo, hi = (g.low * scale, g.high * scale) if g.n > 1 else (g.mean * scale, g.mean * scale)
        ax.plot([lo, hi], [y, y], color=color, lw=2)
        ax.plot([g.mean * scale], [y], "o", color=color)
        margin = c.claim.margin_for(c.baseline_mean)
        if margin is not None:
            ax.plot([-margin * scale], [y], "|", color="black", ms=12)
        paper = c.claim.paper_gain_for(c.baseline_mean)
        if paper is not None:
            ax.plot([paper * scale], [y], "D", color="tab:blue", ms=5)
        rows.append({"claim": c.claim.name, "variant": c.variant.name, "baseline": c.baseline.name, "n": g.n,
                     "gain_percent": g.mean * scale, "low_percent": lo, "high_percent": hi,
                     "margin_percent": None if margin is None else margin * scale,
                     "paper_percent": None if paper is None else paper * scale, "verdict": str(c.judged.verdict)})
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(comparisons)))
    ax.set_yticklabels([f"{c.variant.name} vs {c.baseline.name}" for c in reversed(comparisons)], fontsize=7)
    ax.set_xlabel("gain, % of the baseline (positive favours the variant)")
    doc.figure("verdicts", fig, rows, "Paired gain of each claim's variant over its baseline with its 95% t interval "
               "(green: reproduced or equivalent, red: contradicted, grey: not shown); bars: minus the margin of an "
               "as-good claim; diamonds: the paper's effect.")
