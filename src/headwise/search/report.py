"""``write_search_report``: a head-allocation search's ``report/report.md`` and its figures.

It reads the search folder (``trials.json``, the Optuna store, and ``confirm/``, the confirmation
study, when there is one) and writes only under ``report/``. The confirmation's verdict is judged
by the study report's own machinery (:func:`headwise.report.verdicts.compare_claim`), so this
report and ``headwise report SEARCH/confirm`` cannot disagree on it.

A trial's value is one run at the search's fidelity; only the confirmation has seeds and intervals.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.report.document import Document, fmt, heads_str, plural
from headwise.report.verdicts import Comparison, study_comparisons
from headwise.search import figures
from headwise.search.pareto import pareto_front
from headwise.search.record import (CONFIRM_DIR, OPTUNA_DB, SEARCH_TOML, STUDY_NAME, TRIALS_JSON, Objective,
                                     SearchRecord, Trial, load_search_record)
from headwise.study.layout import load_study_record

REPORT_DIR, REPORT_FILE = "report", "report.md"
#: plans in the best-plans table, and rows of the heat map
TOP, HEATMAP_TOP = 5, 10
#: what a plan costs (trials.json's "budget" of each trial); any can be an objective
BUDGET_METRICS = ("params", "flops_per_token", "kv_bytes_per_token", "total_heads")
STATES = ("complete", "pruned", "running", "failed", "duplicate")
CONFIRM_HOWTO = ("run `headwise search` on this folder again without `--no-confirm`: it reruns the top plans and the "
                 "named plans on fresh paired seeds into `confirm/`, then rewrites this report")


# --------------------------------------------------------------------------- the maths


def best_plans(trials: Sequence[Trial], objective: Objective, k: int = TOP) -> list[Trial]:
    """The ``k`` best distinct plans among the complete trials, by ``objective`` (ties: the
    earlier trial); a plan tried again keeps its best trial."""
    scored = sorted((t for t in trials if t.state == "complete" and t.value(objective.metric) is not None),
                    key=lambda t: (t.score(objective), t.number))
    first = {}
    for t in scored:
        first.setdefault(t.plan, t)  # dicts keep order: the best trial of each plan, best plan first
    return list(first.values())[:k]


def search_gain(trials: Sequence[Trial], objective: Objective,
                baseline: str = "constant") -> tuple[Trial, Trial, float] | None:
    """The search's best complete trial by ``objective``, the named ``baseline``'s trial, and the
    best's gain over it at the search's fidelity (positive favours the best); None without a
    complete trial of the baseline."""
    best = best_plans(trials, objective, 1)
    base = next((t for t in trials if t.named == baseline and t.state == "complete"
                 and t.value(objective.metric) is not None), None)
    return None if not best or base is None else (best[0], base, base.score(objective) - best[0].score(objective))


def survived(search_gain: float, confirmed_gain: float, baseline: str = "constant") -> tuple[float | None, str]:
    """The share of the search's gain over ``baseline`` that the confirmation kept, and a
    sentence saying it; no share when the search found no gain to keep."""
    if not (math.isfinite(search_gain) and math.isfinite(confirmed_gain)):
        return None, "how much of the search's gain survived cannot be computed (a gain is missing)"
    if search_gain <= 0:
        return None, (f"the search found no gain over {baseline} at its fidelity ({search_gain:+.4g}), so none could "
                      f"survive; the confirmation's gain is {confirmed_gain:+.4g}")
    share = confirmed_gain / search_gain
    if confirmed_gain < 0:
        return share, (f"none of the search's gain survived: the sign flipped, {baseline} beats the search's best at "
                       f"confirmation ({confirmed_gain:+.4g} against the search's {search_gain:+.4g}, {share:.0%})")
    if confirmed_gain == 0:
        return 0.0, f"none of the search's gain ({search_gain:+.4g}) survived confirmation (gain 0)"
    return share, (f"{share:.0%} of the search's gain survived confirmation ({confirmed_gain:+.4g} of "
                   f"{search_gain:+.4g})" + ("; the search underrated it" if share > 1 else ""))


def per_layer(importances: dict[str, float]) -> dict[str, float]:
    """Param importances summed per layer (``layer3.heads`` and ``layer3.kv_heads`` -> ``layer 3``);
    a param of no layer (``depth``) stays as itself. Layers first, in order."""
    out: dict[str, float] = {}
    for name, v in sorted(importances.items(), key=lambda kv: _layer_order(kv[0])):
        m = re.match(r"layer(\d+)\.", name)
        key = f"layer {m.group(1)}" if m else name
        out[key] = out.get(key, 0.0) + v
    return out


def _layer_order(name: str) -> tuple[int, int, str]:
    m = re.match(r"layer(\d+)\.", name)
    return (0, int(m.group(1)), name) if m else (1, 0, name)


def value_cell(t: Trial, metric: str) -> str:
    """A trial's value for a table: a budget metric (an objective too) as a whole number."""
    v = t.value(metric)
    return f"{v:,.0f}" if v is not None and metric in BUDGET_METRICS else fmt(v)


def budget_use(value: float | None, budget: dict[str, Any]) -> str:
    """A trial's budget use and its share of the cap (or, without one, of the target)."""
    if value is None:
        return "–"
    ref, what = (budget["max"], "cap") if budget.get("max") else (budget.get("target"), "target")
    return f"{value:,.0f}" + (f" ({100 * value / ref:.1f}% of {what})" if ref else "")


# --------------------------------------------------------------------------- the confirmation


def _interval(c: Comparison) -> str:
    """A confirmed comparison's interval at its claim's level."""
    j = c.judged
    return f"[{fmt(j.low)}, {fmt(j.high)}]" if j.gain.n > 1 else "(one seed)"


def _line(c: Comparison) -> str:
    """``best-1`` vs the baseline: its gain (in points for a percent claim), interval, paired seeds
    and verdict."""
    j = c.judged
    verdict = str(j.verdict) + (f" ({j.note})" if j.note else "")
    level = f" ({100 * j.confidence:.4g}%)" if j.gain.n > 1 else ""
    unit = " points" if c.claim.percent else ""
    return (f"`{c.variant.name}` vs `{c.baseline.name}`: gain {fmt(j.gain.mean)}{unit} {_interval(c)}{level} on "
            f"{plural(j.gain.n, 'paired seed')}, verdict {verdict}")


def same_plan(plan: Plan | None, t: Trial) -> bool:
    """Whether a confirmation variant's plan is the trial's (a side left empty matches any)."""
    if plan is None or plan.heads != t.plan.heads:
        return False
    return all(not a or not b or a == b for a, b in ((plan.head_dims, t.plan.head_dims),
                                                      (plan.kv_heads, t.plan.kv_heads),
                                                      (plan.mlp_hidden, t.plan.mlp_hidden)))


def headline(found: list[Comparison], best: Trial | None) -> Comparison | None:
    """The comparison the report leads with: the search's best plan against the claim's baseline
    (the plan that is the best trial's, else a variant named best..., else the first)."""
    mine = [c for c in found if best is not None and same_plan(c.variant.plan, best)]
    named = [c for c in found if c.variant.name.startswith("best")]
    return (mine or named or found or [None])[0]


def _confirmation(search: SearchRecord, search_dir: Path, best: list[Trial]) -> tuple[list[str], list[Comparison]]:
    """The verdict on top: the confirmed gain of the best plan over the baseline and how much of the
    search's gain it kept, as lines; and the comparisons, for the best-plans table."""
    not_yet = "**Confirmation: not confirmed yet.**"
    if not _confirm_enabled(search):
        return ["**Confirmation: none.** This search's `[confirm]` is disabled (a smoke preset such as `quick`): its "
                "scores are single runs at the search's fidelity, the best of many, and so optimistic."], []
    if not (search_dir / CONFIRM_DIR).is_dir():
        return [f"{not_yet} There is no `{CONFIRM_DIR}/` (the search ran with `--no-confirm`, or is still running); "
                f"to confirm, {CONFIRM_HOWTO}."], []
    try:
        found = study_comparisons(search_dir / CONFIRM_DIR)
    except HeadwiseError as e:
        return [f"{not_yet} `{CONFIRM_DIR}/` cannot be judged: {e}"], []
    top = headline(found, best[0] if best else None)
    if top is None and not load_study_record(search_dir / CONFIRM_DIR).claims:
        return ["**Confirmation: no claim.** The search's best plan was the confirmation's baseline itself, so its "
                f"study in `{CONFIRM_DIR}/` declares no claim that a searched plan beats it (its report compares the "
                "plans: `headwise report confirm`)."], []
    if top is None:
        return [f"{not_yet} The confirmation study in `{CONFIRM_DIR}/` has no completed pair of runs yet; rerun the "
                "search to finish it."], []
    lines = [f"**Confirmation: {_line(top)}.** (Claim *{top.claim.name}* of the study in `{CONFIRM_DIR}/`.)"]
    baseline = top.baseline.name
    objective = next((o for o in search.objectives if o.metric == top.claim.metric), None)
    found_gain = search_gain(search.trials, objective, baseline) if objective is not None else None
    if objective is None:
        lines.append(f"The confirmation compares {top.claim.metric}, which is none of the search's objectives: "
                     "no share of the search's gain to compare.")
    elif found_gain is None:
        note = next((n.get("note") for n in search.named if n.get("name") == baseline and n.get("note")), "")
        lines.append(f"The search has no complete trial of `{baseline}` at its fidelity to take the search's "
                     "gain from" + (f" ({note})." if note else "."))
    else:
        win, base, g = found_gain
        # a percent claim's gain is in points; the search's values are not
        _, sentence = survived(g, top.judged.gain.mean / (100.0 if top.claim.percent else 1.0), baseline)
        lines.append(f"Search's gain at its fidelity (trial {win.number} vs {baseline}'s trial {base.number}, one "
                     f"run each, {objective.metric}): {g:+.4g}; {sentence}.")
    if len(found) > 1:
        lines += ["", "Every comparison of the confirmation study (its report: `headwise report confirm`):",
                  *[f"- {c.claim.name}: {_line(c)}" for c in found]]
    return lines, [c for c in found if c.baseline.name == baseline]


def _confirm_enabled(search: SearchRecord) -> bool:
    """False when the saved definition turns the confirmation off (``[confirm] enabled = false``);
    an unreadable one (the importances section says so) keeps the default."""
    return bool(search.saved.get("definition", {}).get("confirm", {}).get("enabled", True))


# --------------------------------------------------------------------------- Optuna's importances


def open_study(search: SearchRecord, search_dir: Path) -> tuple[Any, str | None]:
    """The search's Optuna study (its store as ``search.toml`` names it), or None and why not."""
    if search.saved_problem is not None:  # a broken search.toml costs the report its importances only
        return None, search.saved_problem
    db, saved = search_dir / OPTUNA_DB, search.saved
    # the folder's own optuna.db first: a saved sqlite URL breaks when the folder moves
    storage = f"sqlite:///{db.resolve()}" if db.is_file() else saved.get("storage")
    if not storage:
        return None, f"there is no `{OPTUNA_DB}` and no `storage` in `{SEARCH_TOML}`"
    name = str(saved.get("study_name") or STUDY_NAME)
    try:
        import optuna

        return optuna.load_study(study_name=name, storage=storage), None
    except Exception as e:  # noqa: BLE001 - any storage error only costs the report its importances
        why = f"the Optuna study `{name}` cannot be opened from `{storage}` ({type(e).__name__}: {e})"
        return None, re.sub(r"//([^:/@\s]*):[^@/\s]*@", r"//\1:***@", why)  # a URL's password never in a report


def importances(study: Any, objectives: list[Objective]) -> tuple[list[dict[str, float]], str | None]:
    """fANOVA importances of the params, one dict per objective, or none and why not."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return [], f"they need at least 2 complete trials and the Optuna study has {len(complete)}"
    if len(study.directions) != len(objectives):
        return [], (f"the Optuna study has {len(study.directions)} objectives and `{TRIALS_JSON}` "
                    f"{len(objectives)}")
    out = []
    for i in range(len(objectives)):
        target = None if len(objectives) == 1 else (lambda t, i=i: t.values[i])
        try:  # seed 0: the same trials give the same report
            imp = get_param_importances(study, target=target, evaluator=FanovaImportanceEvaluator(seed=0))
        except (RuntimeError, ValueError, ZeroDivisionError) as e:
            return [], f"Optuna could not compute them ({type(e).__name__}: {e})"
        out.append({k: float(v) for k, v in imp.items()})
    return out, None


def _importance_section(doc: Document, search: SearchRecord, search_dir: Path) -> None:
    doc.add("## Which layers' choices matter",
            "Optuna's fANOVA importances of the search's params (complete trials; each objective's importances sum "
            "to 1), and the same summed per layer. Optuna leaves out a param that not every complete trial has "
            "(a layer that only deeper plans have).")
    study, why = open_study(search, search_dir)
    imps, why = importances(study, search.objectives) if study is not None else ([], why)
    if not imps or not any(imps):
        doc.add(f"No importances: {why or 'the study has no params'}.")
        return
    names = [o.metric for o in search.objectives]
    doc.table(["param", *names], [[f"`{p}`", *[fmt(i.get(p)) for i in imps]]
                                  for p in sorted(imps[0], key=_layer_order)])
    layers = [per_layer(i) for i in imps]
    doc.table(["layer", *names], [[k, *[fmt(l.get(k)) for l in layers]] for k in layers[0]])
    doc.figure("importances", *figures.importances_figure(names, imps, layers))


# --------------------------------------------------------------------------- the report


def write_search_report(search_dir: str | Path) -> Path:
    """Write ``SEARCH/report/report.md`` and its figures (PNG, each with its CSV); returns its path.

    The confirmation's verdict leads; then the search (trials by state, budget), the best plans,
    the Pareto front (several objectives), the optimisation history, where the heads go, and the
    params' importances. A missing ``trials.json`` is a HeadwiseError; a missing confirmation or
    Optuna store is said in the report."""
    search_dir = Path(search_dir)
    search = load_search_record(search_dir)
    out = search_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    doc = Document(out)
    first = search.objectives[0]
    best = best_plans(search.trials, first, max(TOP, HEATMAP_TOP))
    doc.add(f"# Head-allocation search `{search.name}`" + (f" (preset `{search.preset}`)" if search.preset else ""))
    lines, found = _confirmation(search, search_dir, best)
    doc.add(*lines)
    _header(doc, search, search_dir)
    _best_table(doc, search, best[:TOP], found)
    if len(search.objectives) > 1:
        _pareto_section(doc, search)
    doc.add("## Optimisation history")
    doc.figure("history", *figures.history_figure(search.objectives, search.trials))
    doc.add("## Where the heads go")
    if best:
        doc.figure("heads-heatmap", *figures.heads_heatmap(best[:HEATMAP_TOP], first.metric))
    else:
        doc.add("No complete trial yet.")
    _importance_section(doc, search, search_dir)
    return doc.write(REPORT_FILE)


def _header(doc: Document, search: SearchRecord, search_dir: Path) -> None:
    counts = Counter(t.state for t in search.trials)
    states = ", ".join(f"{counts[s]} {s}" for s in (*STATES, *sorted(set(counts) - set(STATES))) if counts[s])
    b = search.budget
    bounds = [f"{w} {fmt(b[k])}" for k, w in (("max", "at most"), ("min", "at least"), ("target", "target"))
              if b.get(k) is not None]
    budget = f"{b['metric']}{''.join(', ' + x for x in bounds)}" if b.get("metric") else "none"
    objectives = ", ".join(f"{o.metric} ({o.direction})" for o in search.objectives)
    doc.add("## The search",
            f"{plural(len(search.trials), 'trial')}: {states or 'none'}. Objectives: {objectives}. Budget: {budget}. "
            f"Search folder `{search_dir}`; each trial's run is in its `run_dir` there. A duplicate is a plan the "
            "search had already tried (not rerun); a pruned trial stopped early at its last reported value.")


def _best_table(doc: Document, search: SearchRecord, best: list[Trial], found: list[Comparison]) -> None:
    first = search.objectives[0]
    doc.add("## Best plans",
            f"The {plural(len(best), 'best distinct complete plan')} by {first.metric} ({first.direction}), one run "
            "each at the search's fidelity (*lr*: its learning rate, where the search draws it); *confirmed* is the "
            "plan's paired gain over the confirmation's baseline, with its interval, where it was confirmed. Named "
            "plans are marked.")
    if not best:
        doc.add("No complete trial yet.")
        return
    names = {t.plan: t.named for t in search.trials if t.named}
    metric = search.budget.get("metric")
    lr = _lr_searched(search)
    rows = []
    for rank, t in enumerate(best, 1):
        c = next((c for c in found if same_plan(c.variant.plan, t)), None)
        named, plan = t.named or names.get(t.plan), t.plan
        rows.append([rank, t.number, f"*{named}*" if named else "searched", plan.n_layers, heads_str(list(plan.heads)),
                     plan.total, heads_str(list(plan.head_dims)), heads_str(list(plan.kv_heads)),
                     heads_str(list(plan.mlp_hidden)), budget_use(t.budget.get(metric) if metric else None, search.budget),
                     *([fmt(t.lr)] if lr else []), *[value_cell(t, o.metric) for o in search.objectives],
                     f"{fmt(c.judged.gain.mean)} {_interval(c)}" if c else "–"])
    doc.table(["rank", "trial", "plan", "depth", "heads per layer", "total heads", "head widths", "KV heads",
               "MLP widths", f"budget use ({metric})" if metric else "budget use", *(["lr"] if lr else []),
               *[o.metric for o in search.objectives],
               "confirmed" + (f" vs {found[0].baseline.name}" + (" (points)" if found[0].claim.percent else "")
                              if found else "")], rows)


def _lr_searched(search: SearchRecord) -> bool:
    """Whether the search drew each trial's learning rate (its tables then show it)."""
    return any(t.lr is not None for t in search.trials)


def _pareto_section(doc: Document, search: SearchRecord) -> None:
    metrics = [o.metric for o in search.objectives]
    scored = [t for t in search.trials if t.state == "complete" and all(t.value(m) is not None for m in metrics)]
    points = [[t.value(m) for m in metrics] for t in scored]
    front = pareto_front(points, [o.direction for o in search.objectives])  # type: ignore[arg-type]
    doc.add("## Pareto front",
            "The complete trials that no other complete trial beats in every objective at once, best first by "
            f"{metrics[0]}.")
    rows = sorted((scored[i] for i in front), key=lambda t: t.score(search.objectives[0]))
    lr = _lr_searched(search)
    doc.table(["trial", "plan", "depth", "heads per layer", *(["lr"] if lr else []), *metrics],
              [[t.number, t.named or "searched", t.plan.n_layers, heads_str(list(t.plan.heads)),
                *([fmt(t.lr)] if lr else []), *[value_cell(t, m) for m in metrics]] for t in rows])
    if scored:
        doc.figure("pareto", *figures.pareto_figure(search.objectives, scored, front))
