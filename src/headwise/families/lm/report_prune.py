"""The ``prune`` layout (issue 45): where pruning put the heads, and what healing gave back.

    [report]
    kind = "prune"

One table of heads per layer: each variant's trained model (the baseline), each stage's pruned
and healed runs per seed (the heads their ``pruned.json`` kept, by :mod:`headwise.train.prune_init`)
with their final eval loss, and the blog's schemes at the pruned budget (constant, ascending,
descending; :func:`headwise.plans.plan_heads`) that no variant trained, for comparison. Its rows go to
``heads_per_layer.csv``.
"""

from __future__ import annotations

import json
from typing import Any

from headwise.errors import HeadwiseError
from headwise.plans import Scheme, plan_heads
from headwise.report.data import RunRecord, StudyRuns, load_stage_runs
from headwise.report.document import Document, fmt
from headwise.report.registry import Layout, register_layout
from headwise.train.prune_init import PRUNED_JSON

#: the blog's schemes, drawn at the pruned budget beside where pruning put the heads
SCHEMES = (Scheme.CONSTANT, Scheme.ASCENDING, Scheme.DESCENDING)


def pruned_record(run: RunRecord) -> dict[str, Any] | None:
    """A stage run's ``pruned.json`` (None before it is written, or when it does not read)."""
    try:
        return json.loads((run.path / PRUNED_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _row(what: str, seed: Any, heads: list[int] | None, loss: float | None) -> dict[str, Any]:
    return {"model": what, "seed": seed, "heads": " ".join(map(str, heads)) if heads else "–",
            "total_heads": sum(heads) if heads else None, "loss": loss}


def heads_rows(study: StudyRuns, stages: dict[str, StudyRuns]) -> list[dict[str, Any]]:
    """The table's rows: each variant's runs, each stage's pruned runs, the blog's schemes at the
    stages' budget (the first pruned run's total heads) that no variant trained."""
    rows = [_row(v.name, r.seed, list(r.summary.plan.heads) if r.summary else None, r.final())
            for v in study.variants for r in v.runs]
    trained = {r["heads"] for r in rows}
    budget = None
    for name, runs in stages.items():
        for v in runs.variants:
            for r in v.runs:
                record = pruned_record(r)
                heads = record["after"]["heads"] if record else None
                rows.append(_row(f"{name} ({v.name})", r.seed, heads, r.final()))
                budget = budget or (sum(heads) if heads else None)
    first = next((r for v in study.variants for r in v.runs if r.summary is not None), None)
    if budget is None or first is None:
        return rows
    model = first.config.get("model", {})
    for scheme in SCHEMES:
        try:
            plan = plan_heads(scheme, len(first.summary.plan.heads), model.get("d_model"), budget)
        except HeadwiseError:
            continue  # no plan of that scheme at this budget and width
        row = _row(f"{scheme.value} (the blog's, not trained)", "–", list(plan.heads), None)
        if row["heads"] not in trained:  # a variant trained it from scratch: its row is above
            rows.append(row)
    return rows


@register_layout
class PruneLayout(Layout):
    """Heads per layer after pruning, beside the blog's schemes at that budget."""

    kind = "prune"
    conditioning = False

    def sections(self, doc: Document) -> list[str]:
        stages = load_stage_runs(self.study.record)
        rows = heads_rows(self.study, stages)
        doc.add("## Where pruning put the heads",
                "Heads per layer of each trained baseline, of each stage's pruned and healed runs (the heads its "
                f"`{PRUNED_JSON}` kept) and of the blog's schemes at the same total (planned, where no variant trained "
                "them), with the final eval loss of the runs.")
        doc.table(["model", "seed", "heads per layer", "total", "final eval loss"],
                  [[r["model"], r["seed"], r["heads"], r["total_heads"] or "–",
                    fmt(r["loss"]) if r["loss"] is not None else "–"] for r in rows])
        doc.data("heads_per_layer", rows, "heads per layer and final eval loss of every run and scheme")
        return [f"{r['model']} seed {r['seed']}: heads {r['heads']}, eval loss {fmt(r['loss'])}"
                for r in rows if r["loss"] is not None]
