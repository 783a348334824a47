"""What the classification layouts (``vision``, ``lra``) share, much of it in their base class
:class:`AccuracyLayout`: accuracies of a variant's runs in %, their table cells, points and panels
of an accuracy-vs-heads figure labelled with parameters, the seed-noise table against a reference
(Welch's test, Holm's correction), the paper's claim before the findings, and the wording of a
verdict on it ("reproduced", "not reproduced", "within noise", or the one-seed caveat).
"""

from __future__ import annotations

from typing import Any, Callable

from headwise.report import stats
from headwise.report.data import VariantRuns
from headwise.report.document import Document, finish, fixed_ticks, fmt, fmt_p, fmt_params, label_points, plural
from headwise.report.registry import Layout
from headwise.report.sections import ALPHA, noise_verdict, seed_cell, statuses


def accuracy_values(v: VariantRuns, key: str = "accuracy") -> list[float]:
    """A metric of the completed runs, in %."""
    return [100.0 * x for r in v.done if (x := r.final(key)) is not None]


def acc_cell(s: stats.SeedStats, base: stats.SeedStats | None = None) -> str:
    """A mean accuracy (%) with its seed spread; given ``base`` (the baseline's), the difference
    of the means in points, in parentheses, where both have runs."""
    cell = seed_cell(s, 2)
    if s.n and base is not None and base.n:
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
    # a light box keeps a label legible where it crosses a line or an error bar
    label_points(ax, x, y, [fmt_params(v.params) for v in vs], color, side,
                 bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
    rows.extend(point(v) for v in vs)
    ax.margins(x=0.1)  # room for the labels of the outermost points


def finish_heads_panel(ax: Any, x: list[float], title: str) -> None:
    """A panel of accuracy against heads per layer: ticks at the heads drawn, title, grid, legend if any."""
    fixed_ticks(ax, x)
    ax.set_title(title, fontsize=10)
    finish(ax, "heads per layer", legend=7 if ax.get_legend_handles_labels()[0] else None)


def unscored_note(doc: Document, label: str, vs: list[VariantRuns]) -> None:
    """Names ``vs`` (variants without a completed, scored run) with their runs' statuses, after ``label``."""
    if vs:
        doc.add(f"{label} a completed, scored run (left out of the figures and findings): "
                + "; ".join(f"`{v.name}` ({statuses(v) or 'no run'})" for v in vs) + ".")


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


class AccuracyLayout(Layout):
    """A layout of variants scored by top-1 accuracy (``top1``, filled by ``setup``) against heads per
    layer: the classification layouts' drawing, sentences and Welch's tests of it."""

    conditioning_label = "heads per layer"
    top1: dict[str, stats.SeedStats]

    def conditioning_x(self, v: VariantRuns) -> float:
        return float(v.heads[0])

    def acc(self, v: VariantRuns) -> float:
        return self.top1[v.name].mean

    def heads_of(self, v: VariantRuns) -> int:
        """The variant's heads per layer (of its first layer)."""
        return v.heads[0]

    def compare(self, a: VariantRuns, b: VariantRuns) -> stats.Comparison:
        """Welch's test of ``a``'s accuracies against ``b``'s (Holm's correction is the caller's)."""
        return stats.compare(a.name, self.top1[a.name].values, b.name, self.top1[b.name].values)

    def against(self, vs: list[VariantRuns], base: VariantRuns | None) -> list[stats.Comparison]:
        """Each of ``vs`` but ``base`` against ``base``, Holm-corrected together; none where ``base`` has
        no scored run."""
        if base is None or not self.top1[base.name].n:
            return []
        comps = [self.compare(v, base) for v in vs if v is not base]
        stats.apply_holm(comps)
        return comps

    def reference_line(self, ax: Any, base: VariantRuns | None, label: str) -> None:
        """``base``'s mean accuracy dashed across ``ax``, where it has scored runs."""
        if base is not None and self.top1[base.name].n:
            ax.axhline(self.acc(base), color="0.3", ls="--", lw=1, label=f"{label} ({self.acc(base):.2f}%)")

    def heads_line(self, label: str, vs: list[VariantRuns]) -> str:
        """``label: 2 heads 81.00 [1.2M], 4 heads ...``: each of ``vs``'s accuracy and parameters."""
        return f"{label}: " + ", ".join(f"{plural(self.heads_of(v), 'head')} {acc_cell(self.top1[v.name])} "
                                        f"[{fmt_params(v.params)}]" for v in vs) + "."

    def heads_trend(self, label: str, vs: list[VariantRuns]) -> tuple[str, bool]:
        """A finding's text (before its verdict) on how accuracy moves from the fewest heads of ``vs``
        (sorted by heads) to the most, and whether it rises (the most heads the best of all)."""
        lo, hi, acc, heads = vs[0], vs[-1], self.acc, self.heads_of
        rises = acc(hi) > acc(lo) and all(acc(v) <= acc(hi) for v in vs)
        return (f"{label}: {plural(heads(lo), 'head')} {acc(lo):.2f}% -> {plural(heads(hi), 'head')} {acc(hi):.2f}% "
                f"({acc(hi) - acc(lo):+.2f} points; {'rises' if rises else 'does not rise'} with heads): "), rises

    def with_claim(self, findings: list[str], how: str = "") -> list[str]:
        """``findings`` after the paper's claim that they check, where the paper states one."""
        claim = self.options.paper.claim if self.options.paper is not None else ""
        return [f"The paper's claim: \"{claim}\". Each part below is checked on this study's numbers{how}.",
                *findings] if claim and findings else findings

    def noise_report(self, doc: Document, comps: list[stats.Comparison], against: str = "baseline"
                     ) -> tuple[str, bool]:
        """The seed-noise table of ``comps`` (Holm already applied: accuracy, difference in points,
        Welch's test, verdict) and its summary, bold where nothing was testable; returns
        :func:`noise_summary`'s."""
        doc.table(["variant", "top-1 %", f"vs {against} (points)", "Welch t", "p", "p (Holm)", "verdict"],
                  [[f"`{c.name}`", acc_cell(self.top1[c.name]), f"{c.difference:+.2f}", fmt(c.t, 2), fmt_p(c.p),
                    fmt_p(c.p_holm), noise_verdict(c)] for c in comps])
        text, testable = noise_summary(comps, self.study.record.seeds, f"the {against}")
        doc.add(text if testable else f"**{text}**")
        return text, testable
