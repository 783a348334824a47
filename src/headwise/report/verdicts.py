"""The report's verdicts: each ``[[claims]]`` entry of the study tested on paired seeds.

For every comparison of a claim: the seeds both runs completed, the mean gain with its two-sided
t interval at the claim's Bonferroni level (``1 - 5% / m`` for a claim of ``m`` comparisons; the
unadjusted 95% interval goes to ``verdicts.csv``), Cohen's d_z, the smallest distance from the
bound those seeds detect with 80% power, the Bonferroni-adjusted one-sided p-value, the verdict
(:class:`~headwise.report.paired.Verdict`, named after the claim's test) and the scale it was
measured at beside the paper's. An inconclusive comparison gets the seeds its test needs for 80%
power (:func:`~headwise.report.paired.seeds_for_power`). Whether the verdict holds late in
training is read from the eval curves: the same decision is recomputed at every evaluation of
the last quarter of training (:func:`late_check`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from headwise.errors import HeadwiseError
from headwise.report.data import RunRecord, StudyRuns, VariantRuns, load_stage_runs, load_study_runs
from headwise.report.document import Document, fmt, fmt_p, fmt_params, new_figure
from headwise.report.paired import (
    AGAINST, ALPHA, INTERVAL_METHOD, POWER, SUPPORTS, Judged, Verdict, judge, paired_gain, seeds_for_power,
    verdict_of,
)
from headwise.run import RunStatus
from headwise.study.claims import Claim, metric_problem
from headwise.study.layout import load_study_record

#: the late-training check looks at evaluations at steps >= this share of the last one ...
LATE_FROM = 0.75
#: ... and needs at least this many of them to say anything
LATE_MIN_EVALS = 3


def final_value(run: RunRecord, claim: Claim) -> float | None:
    """A completed run's final value of the claim's metric (x 100 with ``percent``)."""
    value = run.final(claim.metric)
    return None if value is None else value * (100.0 if claim.percent else 1.0)


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


def late_check(variant: VariantRuns, baseline: VariantRuns, claim: Claim, judged: Judged) -> str:
    """Whether the claim's decision holds late in training: the same test, bound (margin),
    Bonferroni level and seed pairing as ``judged``, recomputed from the eval curves at every
    evaluation that all the paired seeds share at a step >= 3/4 of the last shared one.

    "stable" when there are at least 3 such evaluations and each gives the reported verdict;
    "changed at step S of L (there: V)" with S the latest whose verdict V differs; "unchecked: only
    K evaluations in the last quarter" with fewer than 3, or "unchecked: ..." for runs that end at
    different steps (a healed stage run against one trained from scratch: the same step is not
    as late in both)."""
    seeds = judged.gain.seeds
    sign = 1.0 if claim.higher_is_better else -1.0
    gains: dict[int, list[float]] = defaultdict(list)
    runs_v = {r.seed: r for r in variant.runs}
    runs_b = {r.seed: r for r in baseline.runs}
    for seed in seeds:
        cv, cb = curve(runs_v[seed], claim), curve(runs_b[seed], claim)
        if cv and cb and max(cv) != max(cb):
            return f"unchecked: the runs end at different steps ({max(cv)} and {max(cb)})"
        for step in cv.keys() & cb.keys():
            gains[step].append(sign * (cv[step] - cb[step]))
    steps = sorted(s for s, g in gains.items() if len(g) == len(seeds))
    window = [s for s in steps if s >= LATE_FROM * steps[-1]] if steps else []
    if len(window) < LATE_MIN_EVALS:
        return f"unchecked: only {len(window)} evaluation{'s' if len(window) != 1 else ''} in the last quarter"
    changed = {s: v for s in window
               if (v := verdict_of(gains[s], judged.test, judged.margin, judged.m)) is not judged.verdict}
    if not changed:
        return "stable"
    step = max(changed)
    return f"changed at step {step} of {steps[-1]} (there: {changed[step]})"


@dataclass(frozen=True)
class Comparison:
    """One row of the verdict table."""

    claim: Claim
    variant: VariantRuns
    baseline: VariantRuns
    baseline_mean: float
    judged: Judged
    #: :func:`late_check`'s answer
    late: str


#: a claim's run sets: (None, variant) the study's runs of a variant, (stage, variant) a stage's
RunSets = Mapping[tuple[str | None, str], VariantRuns]


def run_sets(study: StudyRuns, stages: Mapping[str, StudyRuns]) -> RunSets:
    """Every run set a claim can name (:meth:`~headwise.study.claims.Claim.run_set`)."""
    sets: dict[tuple[str | None, str], VariantRuns] = {(None, v.name): v for v in study.variants}
    sets.update({(name, v.name): v for name, runs in stages.items() for v in runs.variants})
    return sets


def claim_problem(sets: RunSets, claim: Claim) -> str | None:
    """Why ``claim`` cannot be judged on the run sets ``sets`` as declared: it names a variant its
    study or stage does not have, or a metric its runs' task does not report or its completed runs
    did not record (a study file edited after the runs, or saved by another headwise). None when it
    can: comparisons whose runs have not completed yet only wait for them."""
    named = []
    for name in dict.fromkeys(n for pair in claim.pairs for n in pair):
        stage, variant = key = claim.run_set(name)
        if key not in sets:
            have = ", ".join(v for s, v in sets if s == stage)
            return (f"claim {claim.name!r} names variant {variant!r}, which "
                    f"{f'stage {stage!r}' if stage else 'the study'} does not have (variants: {have})")
        named.append(sets[key])
    if claim.metric == "loss":
        return None
    task = next((r.task for v in named for r in v.runs if r.task is not None), None)
    problem = metric_problem(claim.metric, task) if task is not None else None
    if problem:
        return f"claim {claim.name!r} compares {claim.metric!r}, but {problem}"
    evaluated = [r.summary for v in named for r in v.runs
                 if r.status is RunStatus.COMPLETED and r.summary is not None and r.summary.final_eval_loss is not None]
    if evaluated and not any(claim.metric in s.eval_metrics for s in evaluated):
        recorded = sorted({m for s in evaluated for m in s.eval_metrics})
        return (f"claim {claim.name!r} compares {claim.metric!r}, which none of its {len(evaluated)} completed runs "
                f"recorded (they record the loss{''.join(f', {m}' for m in recorded)})")
    return None


def check_claims(study: StudyRuns, claims: list[Claim], stages: Mapping[str, StudyRuns], where: str) -> None:
    """Refuse (HeadwiseError naming ``where``, the study's file) claims that cannot be judged as
    declared (:func:`claim_problem`, or a stage the study does not have): a verdict table never
    leaves a claim out without a word."""
    sets = run_sets(study, stages)
    for claim in claims:
        unknown = [s for n in (n for pair in claim.pairs for n in pair)
                   if (s := claim.run_set(n)[0]) is not None and s not in stages]
        if unknown:
            problem = (f"claim {claim.name!r} compares stage {unknown[0]!r}, which the study does not have "
                       f"(stages: {', '.join(stages) or 'none'})")
        else:
            problem = claim_problem(sets, claim)
        if problem:
            raise HeadwiseError(f"{where}: {problem}; correct its [[claims]] (or rerun the study from a study file "
                                "whose claims fit it)")


def compare_claim(sets: RunSets, claim: Claim) -> list[Comparison]:
    """The claim's comparisons (those whose runs have completed), judged together: Bonferroni
    over the claim's declared pairs, each with the margin and paper effect of its own baseline,
    each side's runs the run set it names in ``sets``, called by that name; seed s pairs with
    seed s (a stage's run of seed s started from the study's run of seed s). A claim that does
    not fit (:func:`claim_problem`) is a HeadwiseError."""
    problem = claim_problem(sets, claim)
    if problem:
        raise HeadwiseError(problem)
    rows = []
    for pair in claim.pairs:
        v, b = (replace(sets[claim.run_set(name)], name=name) for name in pair)
        base = by_seed(b, claim)
        gain = paired_gain(by_seed(v, claim), base, claim.higher_is_better)
        if gain.n > 0:
            rows.append((v, b, gain, sum(base[s] for s in gain.seeds) / gain.n))  # this pair's baseline mean
    if not rows:
        return []
    # m is the declared number of pairs, so an interval's level does not move as runs complete
    # each comparison's margin and paper effect from its own baseline: a margin_percent of one
    # baseline is not the same distance on another
    judged = judge([g for _, _, g, _ in rows], claim.test, margins=[claim.margin_for(mean) for *_, mean in rows],
                   paper_gains=[claim.paper_gain_for(mean) for *_, mean in rows], m=len(claim.pairs))
    return [Comparison(claim, v, b, mean, j, late_check(v, b, claim, j))
            for (v, b, _, mean), j in zip(rows, judged)]


def claim_comparisons(study: StudyRuns, claims: list[Claim], stages: Mapping[str, StudyRuns]) -> list[Comparison]:
    """Every claim's comparisons, each side judged on the run set it names (:func:`run_sets`)."""
    sets = run_sets(study, stages)
    return [c for claim in claims for c in compare_claim(sets, claim)]


def study_comparisons(study_dir: str | Path) -> list[Comparison]:
    """Every comparison of a study folder's claims, judged as its report judges them."""
    record = load_study_record(study_dir)
    return claim_comparisons(load_study_runs(record), record.claims, load_stage_runs(record))


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
    """The mean gain, its interval at the claim's Bonferroni level and the mean as a share of the baseline."""
    j, g = c.judged, c.judged.gain
    if g.n < 2:
        return f"{fmt(g.mean)} (one seed)"
    pct = 100 * g.mean / abs(c.baseline_mean) if c.baseline_mean else math.nan
    return f"{fmt(g.mean)} [{fmt(j.low)}, {fmt(j.high)}] ({pct:+.2f}%)"


def _level(j: Judged) -> str:
    """The interval's confidence and the m it was corrected over: ``97.5% (m = 2)``."""
    return f"{100 * j.confidence:.4g}% (m = {j.m})"


def _test(j: Judged) -> str:
    """The claim's test as the table names it."""
    if j.test == "better":
        return "better (superiority, bound 0)"
    if j.test == "as_good":
        return f"as good (non-inferiority, margin {fmt(j.margin)})"
    return f"equivalent (TOST, margin ±{fmt(j.margin)})"


def _power_finding(c: Comparison) -> str | None:
    """For an inconclusive comparison: the fewest seeds whose test would have 80% power at the
    claim's level and the observed sd, with the true gain it assumes (0 for "as_good" and
    "equivalent", the paper's effect for "better"; none without one)."""
    j, g = c.judged, c.judged.gain
    if j.verdict is not Verdict.NOT_SHOWN or g.n < 2 or not (math.isfinite(g.sd) and g.sd > 0):
        return None
    if j.test == "better":
        if j.paper_gain is None or j.paper_gain <= 0:
            return None
        true, what = j.paper_gain, f"superiority if the true gain is the paper's {fmt(j.paper_gain)}"
    elif j.test == "as_good":
        true, what = 0.0, "non-inferiority if the true gain is 0"
    else:
        true, what = 0.0, "equivalence (both one-sided tests of TOST, exact power) if the true gain is 0"
    need = seeds_for_power(g.sd, j.test, true_gain=true, margin=j.margin, alpha=ALPHA / j.m)
    count = f"about {need} seeds" if need is not None else "more than 1000 seeds"
    return (f"`{c.variant.name}` vs `{c.baseline.name}` ({g.n} seeds ran): {count} for {POWER:.0%} power to show "
            f"{what} (sd {g.sd:.3g} observed, one-sided level {ALPHA / j.m:.3g}).")


def verdict_section(doc: Document, study: StudyRuns, claims: list[Claim],
                    stages: Mapping[str, StudyRuns] | None = None) -> list[str]:
    """The verdict table, its figure and the scale notes; returns the findings: one per
    comparison, plus the seeds an inconclusive one needs and any late-training warning.
    A claim naming a stage's runs (``claim.stage``, ``STAGE/VARIANT``) reads them from ``stages``."""
    comparisons = claim_comparisons(study, claims, stages or {})
    doc.add("## Verdicts on the papers' claims",
            "Each comparison pairs the variant's and the baseline's runs seed by seed (seed s fixes the data "
            "order of both). *Gain* is the mean paired difference oriented so that a positive value favours the "
            f"variant, with its {INTERVAL_METHOD}. Each claim is tested at one-sided {ALPHA:.1%} in all: with m "
            f"comparisons each is one-sided at {ALPHA:.1%}/m, which is exactly when its interval excludes the "
            "bound, and *p* is the one-sided p-value times m (at most 1). The claim's test names the verdict. "
            "*better* (superiority): *superior* when the interval lies above 0, *inferior* when below. *as good* "
            "(non-inferiority, margin declared in the study file before the runs): *non-inferior within the "
            "margin* when the interval lies above minus the margin (also superior when it excludes 0, also "
            "equivalent when it lies within plus or minus the margin), *inferior* when it lies wholly below "
            "minus the margin. *equivalent* (two one-sided tests, TOST; p is the larger of the two): "
            "*equivalent* when the interval lies within plus or minus the margin, *not equivalent* when it lies "
            "wholly beyond one of them. Otherwise *not shown at this scale*. *detectable* is the smallest "
            "distance from the bound these seeds find with 80% power at the claim's level. *same verdict late in "
            f"training* recomputes the decision (same test, bound, level and seeds) at every evaluation from "
            f"{LATE_FROM:.0%} of the last step on: *stable* needs at least {LATE_MIN_EVALS} of them, all agreeing. "
            "The unadjusted 95% intervals are in the figure's data.")
    if not comparisons:
        doc.add("No claim's variants have completed runs yet.")
        return []
    rows, findings = [], []
    for c in comparisons:
        claim, j, g = c.claim, c.judged, c.judged.gain
        verdict = str(j.verdict) + (f" ({j.note})" if j.note else "")
        rows.append([claim.name, f"`{c.variant.name}` vs `{c.baseline.name}`", claim.source or "–", _test(j),
                     claim.label, g.n, _interval(c), _level(j), fmt(g.effect_size, 2), fmt(j.detectable),
                     fmt_p(j.p_adjusted), verdict, c.late])
        findings.append(f"{claim.name} (`{c.variant.name}` vs `{c.baseline.name}`, {g.n} paired seeds): gain "
                        f"{_interval(c)} at {_level(j)} in {claim.label}: **{verdict}**.")
        power = _power_finding(c)
        if power:
            findings.append(power)
        if c.late.startswith("changed"):
            findings.append(f"`{c.variant.name}` vs `{c.baseline.name}`: still moving late in training, the verdict "
                            f"{c.late}; train longer before reading it.")
        elif c.late.startswith("unchecked"):
            findings.append(f"`{c.variant.name}` vs `{c.baseline.name}`: whether the verdict holds late in training "
                            f"is {c.late} (needs {LATE_MIN_EVALS}); evaluate more often to check it.")
    doc.table(["claim", "comparison", "source", "test", "metric", "n",
               "gain [CI, Bonferroni over the claim's m] (% of baseline)", "CI level", "d_z", "detectable",
               "p (one-sided, x m)", "verdict", "same verdict late in training"], rows)
    scales = []
    for claim in claims:
        mine = next((c for c in comparisons if c.claim is claim), None)
        if mine is not None:
            scales.append(f"- {claim.name}: here {_scale(mine)}; the paper: {claim.paper_scale or 'not stated'}.")
    doc.add("Scale of each claim, here and in the paper:", *scales)
    _figure(doc, comparisons)
    return findings


def _figure(doc: Document, comparisons: list[Comparison]) -> None:
    """Each comparison's gain and Bonferroni interval as a share of its baseline, with the null,
    the margins and the papers' effects; its CSV also holds the unadjusted 95% interval."""
    from matplotlib.lines import Line2D  # on first use, as new_figure does

    fig, axes = new_figure(height=1.6 + 0.45 * len(comparisons))
    ax = axes[0, 0]
    rows: list[dict[str, Any]] = []
    for y, c in enumerate(reversed(comparisons)):
        j, g = c.judged, c.judged.gain
        scale = 100 / abs(c.baseline_mean) if c.baseline_mean else math.nan
        color = "tab:green" if j.verdict in SUPPORTS else "tab:red" if j.verdict in AGAINST else "tab:gray"
        lo, hi = (j.low * scale, j.high * scale) if g.n > 1 else (g.mean * scale, g.mean * scale)
        ax.plot([lo, hi], [y, y], color=color, lw=2)
        ax.plot([g.mean * scale], [y], "o", color=color)
        if j.margin is not None:
            for bar in ([-j.margin] if j.test == "as_good" else [-j.margin, j.margin]):
                ax.plot([bar * scale], [y], "|", color="black", ms=12)
        if j.paper_gain is not None:
            ax.plot([j.paper_gain * scale], [y], "D", color="tab:blue", ms=5)
        rows.append({"claim": c.claim.name, "variant": c.variant.name, "baseline": c.baseline.name, "test": j.test,
                     "n": g.n, "m": j.m, "ci_level": j.confidence, "gain_percent": g.mean * scale,
                     "low_adjusted_percent": lo, "high_adjusted_percent": hi,
                     "low_95_unadjusted_percent": g.low * scale, "high_95_unadjusted_percent": g.high * scale,
                     "margin_percent": None if j.margin is None else j.margin * scale,
                     "paper_percent": None if j.paper_gain is None else j.paper_gain * scale,
                     "p_adjusted": j.p_adjusted, "verdict": str(j.verdict), "note": j.note, "late": c.late})
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(comparisons)))
    ax.set_yticklabels([f"{c.variant.name} vs {c.baseline.name}" for c in reversed(comparisons)], fontsize=7)
    ax.set_xlabel("gain, % of the baseline (positive favours the variant)")
    # the legend names only what the figure draws
    colours = {"tab:green" if c.judged.verdict in SUPPORTS else "tab:red" if c.judged.verdict in AGAINST
               else "tab:gray" for c in comparisons}
    handles = [Line2D([], [], color=colour, lw=2, label=label) for colour, label in (
        ("tab:green", "superior / non-inferior / equivalent"), ("tab:red", "inferior / not equivalent"),
        ("tab:gray", "not shown at this scale")) if colour in colours]
    if any(c.judged.margin is not None for c in comparisons):
        handles.append(Line2D([], [], color="black", marker="|", ls="", ms=10, label="margin"))
    if any(c.judged.paper_gain is not None for c in comparisons):
        handles.append(Line2D([], [], color="tab:blue", marker="D", ls="", ms=5, label="paper's effect"))
    ax.legend(handles=handles, fontsize=6, loc="best")
    doc.figure("verdicts", fig, rows, "Paired gain of each claim's variant over its baseline with its t interval at "
               "the claim's Bonferroni level (green: superior, non-inferior or equivalent; red: inferior or not "
               "equivalent; grey: not shown at this scale); bars: minus the margin of an as-good claim, plus and "
               "minus that of an equivalence claim; diamonds: the paper's effect. The CSV also holds each unadjusted "
               "95% interval (low_95_unadjusted_percent, high_95_unadjusted_percent).")
