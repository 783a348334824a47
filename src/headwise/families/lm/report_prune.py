"""The ``prune`` layout (issue 45): where pruning put the heads, and what healing gave back.

    [report]
    kind = "prune"

    search = "../search-96"     # optional: a search folder whose best plans join the table

One table of heads per layer: each variant's trained model (the baseline), each stage's pruned
and healed runs per seed (the heads their ``pruned.json`` kept, by :mod:`headwise.train.prune_init`)
with their final eval loss, the blog's schemes at the pruned budget (constant, ascending,
descending; :func:`headwise.plans.plan_heads`) that no variant trained, and, where ``search`` names
a ``headwise search`` folder, the best distinct plans it found (by its first objective, at its own
fidelity, so their values are not the runs' losses). Its rows go to ``heads_per_layer.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from headwise.errors import HeadwiseError
from headwise.plans import Scheme, plan_heads
from headwise.report.data import RunRecord, StudyRuns, load_stage_runs
from headwise.report.document import Document, fmt
from headwise.report.registry import Layout, LayoutOptions, register_layout
from headwise.search.record import SearchRecord, load_search_record
from headwise.train.prune_init import PRUNED_JSON

#: the blog's schemes, drawn at the pruned budget beside where pruning put the heads
SCHEMES = (Scheme.CONSTANT, Scheme.ASCENDING, Scheme.DESCENDING)


class PruneOptions(LayoutOptions):
    """The ``[report]`` keys of the prune layout."""

    #: a ``headwise search`` folder (absolute, or relative to the study folder) whose best plans are
    #: shown beside where pruning put the heads (None: none shown; one not there is said in the report)
    search: str | None = None
    #: how many of its best distinct plans
    search_top: int = Field(default=3, gt=0)


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


def search_rows(record: SearchRecord, top: int) -> list[dict[str, Any]]:
    """The ``top`` best distinct plans of a search's complete trials by its first objective, each
    a row of the table; the trial's value goes in the row's name (it is the search's fidelity,
    not a run's final loss)."""
    objective = record.objectives[0]
    done = sorted((t for t in record.trials if t.state == "complete" and t.value(objective.metric) is not None),
                  key=lambda t: (t.score(objective), t.number))
    rows, seen = [], set()
    for t in done:
        heads = list(t.plan.heads)
        if tuple(heads) in seen:
            continue
        seen.add(tuple(heads))
        what = (f"search {record.name} #{len(rows) + 1} (trial {t.number}, {objective.metric} "
                f"{fmt(t.value(objective.metric))} at the search's fidelity)")
        rows.append(_row(what, "–", heads, None))
        if len(rows) == top:
            break
    return rows


def search_folder(study_dir: Path, given: str) -> Path:
    """The ``search`` option's folder: as given when absolute, else under the study folder."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else study_dir / path


@register_layout
class PruneLayout(Layout):
    """Heads per layer after pruning, beside the blog's schemes at that budget and a search's best plans."""

    kind = "prune"
    Options = PruneOptions
    conditioning = False

    def sections(self, doc: Document) -> list[str]:
        opts: PruneOptions = self.options
        stages = load_stage_runs(self.study.record)
        rows = heads_rows(self.study, stages)
        searched = ""
        if opts.search is not None:
            try:
                record = load_search_record(search_folder(self.study.record.path, opts.search))
            except HeadwiseError as exc:  # said in the report, which the study's runs still deserve
                searched = f" (no search's plans: {exc})"
            else:
                rows += search_rows(record, opts.search_top)
                searched = f", and the best plans of the search in `{opts.search}`"
        doc.add("## Where pruning put the heads",
                "Heads per layer of each trained baseline, of each stage's pruned and healed runs (the heads its "
                f"`{PRUNED_JSON}` kept) and of the blog's schemes at the same total (planned, where no variant trained "
                f"them){searched}, with the final eval loss of the runs.")
        doc.table(["model", "seed", "heads per layer", "total", "final eval loss"],
                  [[r["model"], r["seed"], r["heads"], r["total_heads"] or "–",
                    fmt(r["loss"]) if r["loss"] is not None else "–"] for r in rows])
        doc.data("heads_per_layer", rows, "heads per layer and final eval loss of every run and scheme")
        return [f"{r['model']} seed {r['seed']}: heads {r['heads']}, eval loss {fmt(r['loss'])}"
                for r in rows if r["loss"] is not None]
