"""What the classification layouts (``vision``, ``lra``) share: accuracies of a variant's runs in %,
their table cells, points of an accuracy-vs-heads figure labelled with parameters, the seed-noise
table against a reference (Welch's test, Holm's correction), and the wording of a verdict on a
published claim ("reproduced", "not reproduced", "within noise", or the one-seed caveat).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

from headwise.report import stats
from headwise.report.data import VariantRuns
from headwise.report.document import LABEL_SIDES, Document, fmt, fmt_p, fmt_params
from headwise.report.sections import ALPHA


def accuracy_values(v: VariantRuns, key: str = "accuracy") -> list[float]:
    """A metric of the completed runs, in %."""
    vals = [r.summary.eval_metrics.get(key) for r in v.done if r.summary is not None]
    return [100.0 * float(x) for x in vals if isinstance(x, (int, float)) and math.isfinite(x)]


def statuses(v: VariantRuns) -> str:
    """The variant's runs by status: ``2 completed, 1 failed``."""
    return ", ".join(f"{n} {s}" for s, n in Counter(r.status.value for r in v.runs).items())


def acc_cell(s: stats.SeedStats, base: stats.SeedStats | None = None) -> str:
    """A mean accuracy (%) with its seed spread; given ``base`` (the baseline's), the difference
    of the means in points, in parentheses, where both have runs."""
    if s.n == 0:
        return "–"
    cell = f"{s.mean:.2f}" if s.n == 1 else f"{s.mean:.2f} ± {s.std:.2f} (n={s.n})"
    if base is not None and base.n:
        cell += f" ({s.mean - base.mean:+.2f})"
    return cell


def draw_accuracy(ax: Any, vs: list[VariantRuns], x: list[float], top1: dict[str, stats.SeedStats], color: str,
                  label: str | None, side: int, rows: list[dict[str, Any]],
                  point: Callable[[VariantRuns], dict[str, Any]]) -> None:
    """Mean accuracy of ``vs`` at ``x`` (error bars one sd where a variant has seeds), each point
    labelled with its parameters; appends ``point(v)`` of each to ``rows`` (the figure's CSV)."""
    seeds = any(top1[v.name].n > 1 for v in vs)
    y = [top1[v.name].mean for v in vs]
    yerr = [top1[v.name].std if top1[v.name].n > 1 else 0.0 for v in vs] if seeds else None
    ax.errorbar(x, y, yerr=yerr, marker="o", color=color, capsize=3, label=label)
    dx, dy, ha = LABEL_SIDES[side % len(LABEL_SIDES)]
    for v, xi, yi in zip(vs, x, y):
        # a light box keeps a label legible where it crosses a line or an error bar
        ax.annotate(fmt_params(v.params), (xi, yi), textcoords="offset points", xytext=(dx, dy), ha=ha,
                    fontsize=7, color=color, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
        rows.append(point(v))
    ax.margins(x=0.1)  # room for the labels of the outermost points


def noise_verdict(c: stats.Comparison) -> str:
    """A comparison's cell in the seed-noise table."""
    if not c.testable:
        return "no claim (needs >= 2 seeds each)"
    return "distinguishable from seed noise" if c.p_holm < ALPHA else "within seed noise"


def noise_table(doc: Document, comps: list[stats.Comparison], top1: dict[str, stats.SeedStats],
                against: str = "baseline") -> None:
    """The rows of ``comps`` (Holm already applied): accuracy, difference in points, Welch's test, verdict."""
    doc.table(["variant", "top-1 %", f"vs {against} (points)", "Welch t", "p", "p (Holm)", "verdict"],
              [[f"`{c.name}`", acc_cell(top1[c.name]), f"{c.difference:+.2f}", fmt(c.t, 2), fmt_p(c.p),
                fmt_p(c.p_holm), noise_verdict(c)] for c in comps])


def noise_summary(comps: list[stats.Comparison], seeds: int, against: str = "the baseline") -> tuple[str, bool]:
    """What the seed-noise table allows to say, and whether anything was testable."""
    if not any(c.testable for c in comps):
        if seeds >= 2:  # several seeds, but every one gave its configuration the same value
            return (f"With {seeds} seeds, no configuration's values differ between seeds, so Welch's test cannot "
                    "judge any difference; more seeds or more evaluated examples would."), False
        return ("Each configuration was trained with one seed, so noise cannot be judged: no difference can be "
                "called real or within noise; rerun with `--seeds 3` (or more) to test them."), False
    within = [f"`{c.name}`" for c in comps if c.testable and c.p_holm >= ALPHA]
    sig = [f"`{c.name}`" for c in comps if c.testable and c.p_holm < ALPHA]
    return (f"With {seeds} seeds, {len(sig)} of {len(comps)} differences from {against} are distinguishable from "
            "seed noise" + (f" ({', '.join(sig)})" if sig else "")
            + (f"; within noise: {', '.join(within)}" if within else "") + "."), True


def verdict(c: stats.Comparison | None, holds: bool) -> str:
    """'reproduced' or 'not reproduced' when a Holm-corrected Welch test is distinguishable (or, with
    one seed, from the sign alone, saying so); 'within noise' when it is not."""
    if c is None or not c.testable:
        return ("reproduced" if holds else "not reproduced") + " (one seed: noise cannot be judged)"
    if c.p_holm >= ALPHA:
        return f"within noise (Welch p = {fmt_p(c.p_holm)}, Holm-corrected)"
    return ("reproduced" if holds else "not reproduced") + f" (Welch p = {fmt_p(c.p_holm)}, Holm-corrected)"
