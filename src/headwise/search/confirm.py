"""The confirmation: the search's best plans against the named ones, as a verdict study.

A search's best trial is an optimistic draw: of many plans trained once on one seed, the one that
came out best owes some of its lead to that seed (the winner's curse). So the claim the search
makes, "the search's best beats the baseline" (a named plan, constant by default), is declared
before its own runs and tested on runs the search never saw: a study
(:mod:`headwise.study.definition`) whose variants are the top-k distinct plans (``best-1``,
``best-2``, ...; a top plan that is a named one keeps its name) and every named plan, on paired
seeds ``0 .. seeds-1`` (the trials trained on ``[fidelity] run_seed``, which must lie outside
them and outside the tuning seeds), each variant at its own tuned learning rate when ``[confirm]
nuisance`` says so, at ``[confirm] steps``. Its runs start from the search's base without
``[fidelity] set``: trials that selected on a hold-out of the training data leave the
confirmation the evaluation data the search never chose by (the winner's curse on data, as on
seeds). It runs with :func:`headwise.study.runner.run_study` into ``SEARCH_DIR/confirm`` and
resumes like any study; its report has the verdict.

The top plans are the best by the first measured objective at the trials' fidelity; with several
objectives they are taken along the Pareto front instead (:func:`top_plans`). Where the search
draws each trial's learning rate, a top plan trains at its trial's unless the study tunes
``optim.lr`` itself; the named plans train at the base's, or at their tuned ones.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, NamedTuple

from headwise.errors import HeadwiseError, RunFailure
from headwise.report.document import plural
from headwise.plans import Plan
from headwise.search.definition import LR, Search
from headwise.search.pareto import pareto_select
from headwise.search.record import oriented
from headwise.study.definition import Study, resolve_study
from headwise.study.nuisance import DEFAULT_SEEDS


class Top(NamedTuple):
    """A plan the confirmation takes from the trials: its variant name, the plan, and the learning
    rate its trial drew (None: the base's)."""

    name: str
    plan: Plan
    lr: float | None = None


def top_plans(search: Search, record: dict[str, Any]) -> list[Top]:
    """The top-k distinct plans of the complete trials, best first by the first measured objective
    (ties: the earlier trial), each with its best trial's learning rate, under its variant name:
    the named plan's name when it is one, else ``best-N``. With several objectives the k are
    chosen along the Pareto front (:func:`~headwise.search.pareto.pareto_select`: whole fronts
    while they fit, then the most isolated plans of the next), not by the first objective alone."""
    objectives = search.config.objectives
    first = next(o for o in objectives if not o.from_budget)
    metrics = [o.metric for o in objectives]
    done = [t for t in record["trials"] if t["state"] in ("complete", "duplicate")
            and all(m in t["values"] for m in metrics)]
    done.sort(key=lambda t: (oriented(t["values"][first.metric], first.direction), t["number"]))
    best: dict[Plan, dict[str, Any]] = {}
    for t in done:  # each plan's best trial, best plan first
        best.setdefault(search.space.decode(lambda name, p=t["params"]: p[name]), t)
    plans, k = list(best), search.config.confirm.top_k
    if len(objectives) > 1:
        keep = set(pareto_select([[best[p]["values"][m] for m in metrics] for p in plans],
                                 [o.direction for o in objectives], k))
        plans = [p for i, p in enumerate(plans) if i in keep]
    named = {n.plan: n.name for n in search.named if n.plan is not None}
    out: list[Top] = []
    for plan in plans[:k]:
        out.append(Top(named.get(plan, f"best-{sum(1 for t in out if t.name.startswith('best-')) + 1}"), plan,
                       best[plan].get("lr")))
    return out


def confirm_raw(search: Search, top: list[Top]) -> dict[str, Any]:
    """The confirmation study as a study file's tables."""
    confirm = search.config.confirm
    base = copy.deepcopy(search.confirm_base)  # without [fidelity] set: the trials' own data stays theirs
    base.get("model", {}).pop("heads", None)  # every variant sets its heads (a scheme through [model.plan])
    base["train"].pop("seed", None)            # the study sets each run's seed
    if confirm.steps is not None:
        base["train"]["steps"] = confirm.steps
    # a plan's searched learning rate, unless the study tunes it for every variant
    searched = {t.name: t.lr for t in top if t.lr is not None and LR not in (confirm.nuisance or {}).get("values", {})}
    variants = [{"name": t.name, "set": {**search.space.run_sets(t.plan), **({LR: searched[t.name]}
                                                                            if t.name in searched else {})}}
                for t in top]
    variants += [{"name": n.name, "set": n.sets} for n in search.named if n.name not in {v["name"] for v in variants}]
    objective = next(o for o in search.config.objectives if not o.from_budget)
    best = next((t.name for t in top if t.name != confirm.baseline), None)
    raw: dict[str, Any] = {
        "name": f"{search.name}-confirm",
        "description": f"The confirmation of search {search.name}: the best {plural(confirm.top_k, 'plan')} of its "
                       f"trials (at {search.base['train']['steps']} steps" + (", each at the learning rate its trial "
                       "drew" if searched else "") + f") against its named plans, each trained "
                       f"{base['train']['steps']} steps on fresh paired seeds.",
        "seeds": confirm.seeds,
        "base": base,
        "variants": variants,
        "report": copy.deepcopy(confirm.report),
    }
    if best is not None:
        sets = search.config.fidelity.describe_set()
        selected = f" (with {sets})" if sets else ""  # what the trials alone were run with
        claim = {"name": f"the search's best beats {confirm.baseline}",
                 "source": f"headwise search {search.name}" + (f" --preset {search.preset}" if search.preset else "")
                           + f": the best of its trials at {search.base['train']['steps']} steps on seed "
                             f"{search.config.fidelity.run_seed}{selected}, declared before these runs",
                 "metric": objective.metric, "pairs": [[best, confirm.baseline]]}
        if objective.metric != "loss":
            claim["better"] = "lower" if objective.direction == "minimize" else "higher"
        if objective.metric.endswith("accuracy"):  # a fraction: in points, as the studies' accuracy claims
            claim["percent"] = True
        raw["claims"] = [claim]
    if confirm.nuisance is not None:
        raw["nuisance"] = copy.deepcopy(confirm.nuisance)
    return raw


def confirm_study(search: Search, top: list[Top]) -> Study:
    """The confirmation study, resolved (every variant's run config checked)."""
    return resolve_study(confirm_raw(search, top), f"{search.source} [confirm]")


def check_confirm(search: Search) -> None:
    """Refuse, before any trial, a confirmation that could not run: a baseline that is no named
    plan, seeds that reach the trials' seed, a study its runs would refuse (checked with the
    first feasible plan as the best)."""
    confirm = search.config.confirm
    where = f"{search.source} [confirm]"
    names = [n.name for n in search.named]
    if confirm.baseline not in names:
        raise HeadwiseError(f"{where}: baseline {confirm.baseline!r} is not a named plan (named: "
                            f"{', '.join(names) or 'none'}); name one, or set [confirm] enabled = false")
    seed = search.config.fidelity.run_seed
    tuning = (confirm.nuisance or {}).get("seeds", list(DEFAULT_SEEDS)) if confirm.nuisance else []
    if seed < confirm.seeds or seed in tuning:
        raise HeadwiseError(f"{where}: the trials train on seed {seed} ([fidelity] run_seed), which the confirmation "
                            f"would use again (seeds 0..{confirm.seeds - 1}, tuning {tuning}); its seeds must be "
                            "fresh: give a run_seed outside them")
    example = next(search.space.plans(limit=1))
    confirm_study(search, [Top("best-1", example)])


def run_confirmation(search: Search, search_dir: Path, record: dict[str, Any], *, jobs: int | None,
                     threads: int | None, report: Callable[[Path], Path] | None,
                     echo: Callable[[str], None], backend: str = "local", address: str | None = None) -> Any:
    """Run (or resume) the confirmation study in ``SEARCH_DIR/confirm`` on ``backend`` (the
    search's; ``"ray"`` joins the cluster at ``address``); its outcome."""
    from headwise.study.runner import run_study

    top = top_plans(search, record)
    if not top:
        raise RunFailure(f"search {search.name}: no trial completed, so there is nothing to confirm")
    study = confirm_study(search, top)
    echo("confirmation: " + "; ".join(f"{t.name} = {t.plan.describe()}" + (f", lr {t.lr:.3g}" if t.lr else "")
                                      for t in top)
         + f", against {', '.join(n.name for n in search.named)}")
    try:
        return run_study(study, search_dir / "confirm", jobs=jobs, threads=threads, backend=backend, address=address,
                         report=report, echo=echo)
    except HeadwiseError as exc:
        if "holds a different study" in str(exc):
            raise HeadwiseError(f"{search_dir / 'confirm'} holds the confirmation of other top plans (the search has "
                                "had more trials since): move it aside to confirm the new ones") from None
        raise
