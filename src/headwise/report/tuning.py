"""The report's tuning section: what each variant's nuisance settings were tuned to (from
``tuning/tuning.json``), the selection metric against each tried value, and any choice left at
the edge of its grid."""

from __future__ import annotations

from typing import Any

from headwise.report.document import Document, fmt, new_figure
from headwise.study.nuisance import Choice, Nuisance

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
            tried = sorted((p[key], v) for p, v in c.tried.values() if v is not None
                           and all(p[k] == (c.best or p)[k] for k in keys if k != key))
            color = f"C{i % 10}"  # matplotlib's default cycle, as the layouts colour their series
            ax.plot([x for x, _ in tried], [y for _, y in tried], "o-", color=color, label=c.variant)
            if c.best is not None:
                best = next((y for x, y in tried if x == c.best[key]), None)
                ax.plot([c.best[key]], [best], "*", color=color, ms=12)
            points += [{"variant": c.variant, "key": key, "value": x, nuisance.metric: y,
                        "chosen": c.best is not None and x == c.best[key]} for x, y in tried]
        if all(x > 0 for x in nuisance.values[key]):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"selection {nuisance.metric}")
        ax.legend(fontsize=7)
    doc.figure("tuning", fig, points, f"Selection {nuisance.metric} against each tuned setting per variant (the other "
               "settings at their chosen values); stars: the chosen values.")
    return [f"`{c.variant}`: its {', '.join(c.at_edge)} is at the edge of the tried grid after "
            f"{sum(c.extensions.values())} extensions: extend it before trusting this comparison." for c in choices if c.at_edge]
