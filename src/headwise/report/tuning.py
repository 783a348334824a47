"""The report's tuning section: what each variant's nuisance settings were tuned to (from
``tuning/tuning.json``), the selection metric against each tried value, and any choice left at
the edge of its grid."""

from __future__ import annotations

from typing import Any

from headwise.report.document import Document, fmt, new_figure
from headwise.study.nuisance import Choice, Nuisance, agreement, pooled_agreement

def tuning_section(doc: Document, nuisance: Nuisance, choices: list[Choice]) -> list[str]:
    """The choices table and one panel per tuned key; returns findings about grid edges."""
    keys = sorted(nuisance.values)
    sel = ", ".join(f"`{k} = {v}`" for k, v in nuisance.selection.items())
    seeds = sorted({s for c in choices for s in c.seeds}) or list(nuisance.seeds)
    apart = ("seeds the verdicts do not use" if min(seeds) > 0 else
             "seed 0, which is also one of the compared seeds (a study tuned before tuning seeds were kept apart: "
             "that run is the grid's winner, an optimistic draw)")
    doc.add("## Tuning", f"Each variant ran at every tried value on tuning seed{'s' if len(seeds) > 1 else ''} "
            f"{', '.join(map(str, seeds))} ({apart}), selected on {sel} (not the split reported), by the mean "
            f"{nuisance.metric} over those seeds ({nuisance.better} is better); its seeds then ran at its own best "
            "value. A choice at the edge of what was tried is flagged: the grid should be extended.")
    rows = []
    for c in choices:
        best = c.best or {}
        rows.append([f"`{c.variant}`", *[fmt(best.get(k), 4) for k in keys], len(c.tried),
                     ", ".join(c.at_edge) or "no"])
    doc.table(["variant", *keys, "runs tried", "at an edge"], rows)
    fig, axes = new_figure(5.0 * len(keys), 3.8, ncols=len(keys))
    points: list[dict[str, Any]] = []
    for col, key in enumerate(keys):
        ax = axes[0, col]
        for i, c in enumerate(choices):
            tried = sorted((p[key], v, c.evaluated.get(name)) for name, (p, v) in c.tried.items() if v is not None
                           and all(p[k] == (c.best or p)[k] for k in keys if k != key))
            color = f"C{i % 10}"  # matplotlib's default cycle, as the layouts colour their series
            ax.plot([x for x, _, _ in tried], [y for _, y, _ in tried], "o-", color=color, label=c.variant)
            if c.best is not None:
                best = next((y for x, y, _ in tried if x == c.best[key]), None)
                ax.plot([c.best[key]], [best], "*", color=color, ms=12)
            points += [{"variant": c.variant, "key": key, "value": x, nuisance.metric: y,
                        f"evaluated_{nuisance.metric}": e, "chosen": c.best is not None and x == c.best[key]}
                       for x, y, e in tried]
        if all(x > 0 for x in nuisance.values[key]):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"selection {nuisance.metric}")
        ax.legend(fontsize=7)
    doc.figure("tuning", fig, points, f"Selection {nuisance.metric} against each tuned setting per variant (the other "
               "settings at their chosen values); stars: the chosen values.")
    findings = _agreement(doc, nuisance, choices)
    return findings + [f"`{c.variant}`: its {', '.join(c.at_edge)} is at the edge of the tried grid after "
            f"{sum(c.extensions.values())} extensions: extend it before trusting this comparison." for c in choices if c.at_edge]


def _agreement(doc: Document, nuisance: Nuisance, choices: list[Choice]) -> list[str]:
    """The table of how tuning agrees with the evaluation (each tuning run also scored on the
    split the report compares on, never used to choose); a finding for each variant whose choice
    the evaluation would not have made."""
    found = [a for a in (agreement(c, nuisance) for c in choices) if a is not None]
    if not found:
        return []
    pooled = pooled_agreement(choices)
    doc.add(f"Tuning against the evaluation: every tuning run was also scored on the split the report compares on "
            f"(never used to choose). Regret: how much worse the chosen value's {nuisance.metric} is there than the "
            f"best tried value's. Spearman's rho of the selection and evaluation values over every variant's points "
            f"together: {fmt(pooled, 3)} (1: the same order; – under three points).")
    doc.table(["variant", "tuning chose", "evaluation's best", "regret", "rank correlation"],
              [[f"`{a.variant}`", a.chosen, a.evaluation_best, fmt(a.regret, 4), fmt(a.spearman, 3)] for a in found])
    return [f"`{a.variant}`: tuning chose {a.chosen}, but on the split the report compares on {a.evaluation_best} was "
            f"better by {fmt(a.regret, 4)}: this variant's tuning does not predict its evaluation."
            for a in found if a.chosen != a.evaluation_best]
