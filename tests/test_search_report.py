"""The report of a head-allocation search, from a hand-written search folder: ``trials.json``, a
real small Optuna SQLite study and, for the confirmation, a fake study folder with hand-worked
paired gains (as ``test_verdicts.py`` builds them)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import tomli_w

from headwise.errors import HeadwiseError
from headwise.plans import Plan
from headwise.run import RunStatus, RunSummary
from headwise.search.figures import best_so_far
from headwise.search.record import Objective, Trial
from headwise.search.report import (
    best_plans, budget_use, pareto_front, per_layer, search_gain, survived, write_search_report,
)
from headwise.study import load_study
from headwise.study.layout import run_dir, save_study

from helpers import read_csv, tiny_nearest_config, write_run_dir

LOSS = Objective(metric="loss", direction="minimize")
BUDGET = {"metric": "total_heads", "max": 20, "min": None, "target": None}


def trial(number, heads, loss=None, state="complete", named=None, params=1000, **extra) -> dict:
    """A trial of trials.json as the search writes it."""
    values = {"loss": loss, "params": params} if loss is not None else {}
    return {"number": number, "state": state, "params": {"depth": 0.5, "layer0.heads": 0.25}, "depth": len(heads),
            "heads": heads, "head_dims": [4] * len(heads), "kv_heads": [], "mlp_hidden": [],
            "budget": {"params": params, "flops_per_token": 10 * params, "kv_bytes_per_token": 8 * sum(heads),
                       "total_heads": sum(heads)},
            "values": values, "steps": 100, "run_dir": f"trials/{number:04d}", "duplicate_of": None, "named": named,
            **extra}


#: every state, a plan tried twice (3 and 7), a duplicate (6) and plans of three depths
TRIALS = [
    trial(0, [4, 4, 4, 4], 3.0, named="constant", params=900),
    trial(1, [2, 3, 5, 6], 2.9, named="ascending", params=950),
    trial(2, [6, 5, 3, 2], 3.1, named="descending", params=800),
    trial(3, [3, 5, 5, 3], 2.8, params=1200),
    trial(4, [8, 8], 3.5, state="pruned"),
    trial(5, [1, 1, 1, 1], state="failed"),
    trial(6, [3, 5, 5, 3], 2.8, state="duplicate", duplicate_of=3, params=1200),
    trial(7, [3, 5, 5, 3], 2.85, params=1200),
    trial(8, [6, 6, 4], 2.95, params=700),
    trial(9, [2, 2, 2, 2, 2], state="running"),
]


def write_search(tmp_path: Path, trials: list[dict], objectives=(("loss", "minimize"),), optuna_trials=8,
                 **record) -> Path:
    """A search folder: its trials.json and (``optuna_trials`` complete trials, plus a pruned and
    a failed one) its Optuna store."""
    out = tmp_path / "search"
    out.mkdir(parents=True)
    (out / "trials.json").write_text(json.dumps({
        "search": "toy", "preset": "tiny", "objectives": [{"metric": m, "direction": d} for m, d in objectives],
        "budget": BUDGET, "trials": trials, **record}))
    optuna = pytest.importorskip("optuna")
    from optuna.distributions import FloatDistribution

    study = optuna.create_study(storage=f"sqlite:///{out / 'optuna.db'}", study_name="headwise-search",
                                directions=[d for _, d in objectives])
    rng = random.Random(0)
    names = ["depth", "layer0.heads", "layer0.kv_heads", "layer1.heads", "layer2.heads"]
    for k in range(optuna_trials + 2):
        p = {n: rng.random() for n in names}
        state = [optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL][k - optuna_trials] \
            if k >= optuna_trials else optuna.trial.TrialState.COMPLETE
        values = [3 * p["layer0.heads"] + p["depth"] + 0.1 * p["layer2.heads"], p["layer1.heads"]][:len(objectives)]
        study.add_trial(optuna.trial.create_trial(
            params=p, distributions={n: FloatDistribution(0, 1) for n in names}, state=state,
            values=values if state == optuna.trial.TrialState.COMPLETE else None))
    return out


# --------------------------------------------------------------------------- the maths


def test_the_pareto_front_against_a_hand_worked_case_in_both_directions():
    # (loss, params): 0 and 1 trade off; 2 is beaten by 0 in both; 3 ties 0 exactly (neither dominates);
    # 4 equals 1 in loss but is worse in params
    points = [(1.0, 10), (2.0, 5), (1.5, 12), (1.0, 10), (2.0, 6)]
    assert pareto_front(points, ["minimize", "minimize"]) == [0, 1, 3]
    # maximising both: 2 (1.5, 12) beats 0 and 3; 4 (2.0, 6) beats 1; nothing beats 2 or 4
    assert pareto_front(points, ["maximize", "maximize"]) == [2, 4]
    # accuracy up, params down: (2.0, 5) is best in both
    assert pareto_front(points, ["maximize", "minimize"]) == [1]
    assert pareto_front([], ["minimize"]) == []


def test_the_best_plans_are_ordered_distinct_and_complete_only():
    trials = [Trial.from_dict(t) for t in TRIALS]
    best = best_plans(trials, LOSS, 5)
    # 3 (2.8) before its rerun 7 (2.85), which is left out; the duplicate 6, pruned 4, failed 5, running 9 never rank
    assert [t.number for t in best] == [3, 1, 8, 0, 2]
    assert [t.number for t in best_plans(trials, Objective(metric="loss", direction="maximize"), 3)] == [2, 0, 8]
    assert [t.number for t in best_plans(trials, LOSS, 2)] == [3, 1]
    # ties go to the earlier trial
    tied = [Trial.from_dict(trial(n, [n + 1], 1.0)) for n in (5, 2, 9)]
    assert [t.number for t in best_plans(tied, LOSS)] == [2, 5, 9]


def test_the_search_s_gain_over_constant_is_oriented_so_that_positive_favours_the_best():
    trials = [Trial.from_dict(t) for t in TRIALS]
    best, base, g = search_gain(trials, LOSS)
    assert (best.number, base.number, g) == (3, 0, pytest.approx(0.2))
    # maximising the same values: the descending trial's 3.1 is best, 0.1 above constant's 3.0
    best, base, g = search_gain(trials, Objective(metric="loss", direction="maximize"))
    assert (best.number, base.number, g) == (2, 0, pytest.approx(0.1))
    # constant is the best: no gain; no complete constant trial: none to take
    alone = [Trial.from_dict(trial(0, [4, 4], 3.0, named="constant")), Trial.from_dict(trial(1, [2, 6], 3.2))]
    assert search_gain(alone, LOSS)[2] == 0
    assert search_gain(trials[1:], LOSS) is None
    # against another named baseline
    best, base, g = search_gain(trials, LOSS, "ascending")
    assert (best.number, base.number, g) == (3, 1, pytest.approx(0.1))


@pytest.mark.parametrize("search, confirmed, share, words", [
    (0.2, 0.03, 0.15, "15% of the search's gain survived"),
    (0.2, 0.3, 1.5, "the search underrated it"),
    (0.2, -0.05, -0.25, "the sign flipped"),
    (0.2, 0.0, 0.0, "none of the search's gain (+0.2) survived"),
    (0.0, 0.03, None, "the search found no gain over constant"),
    (-0.1, 0.03, None, "the search found no gain over constant at its fidelity (-0.1)"),
    (math.nan, 0.03, None, "cannot be computed"),
])
def test_the_share_that_survived(search, confirmed, share, words):
    got, sentence = survived(search, confirmed)
    assert (got is None) if share is None else got == pytest.approx(share)
    assert words in sentence


def test_the_share_names_the_confirmation_s_baseline():
    assert "the sign flipped, ascending beats the search's best" in survived(0.2, -0.1, "ascending")[1]
    assert "no gain over ascending" in survived(0.0, 0.1, "ascending")[1]


def test_importances_per_layer_sum_the_params_of_each_layer():
    imp = {"layer10.heads": 0.05, "depth": 0.3, "layer2.heads": 0.2, "layer2.kv_heads": 0.1, "layer0.heads": 0.35}
    layers = per_layer(imp)
    assert list(layers) == ["layer 0", "layer 2", "layer 10", "depth"]
    assert layers["layer 2"] == pytest.approx(0.3) and layers["depth"] == 0.3
    assert sum(layers.values()) == pytest.approx(sum(imp.values()))


def test_the_best_so_far_runs_in_the_objective_s_direction():
    assert best_so_far([3.0, 1.0, 2.0, 0.5], "minimize") == [3.0, 1.0, 1.0, 0.5]
    assert best_so_far([0.2, 0.1, 0.4, 0.3], "maximize") == [0.2, 0.2, 0.4, 0.4]
    assert best_so_far([], "minimize") == []


def test_budget_use_is_a_share_of_the_cap_else_of_the_target():
    assert budget_use(15, BUDGET) == "15 (75.0% of cap)"
    assert budget_use(1500, {"metric": "params", "max": None, "target": 1000}) == "1,500 (150.0% of target)"
    assert budget_use(12, {"metric": "total_heads", "min": 8}) == "12"
    assert budget_use(None, BUDGET) == "–"


# --------------------------------------------------------------------------- the report


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading``."""
    table: list[str] = []
    for line in text[text.index(heading):].splitlines():
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return [[c.strip() for c in line.split("|")[1:-1]] for line in table[2:]]  # past the header and its rule


def test_an_unconfirmed_search_s_report(tmp_path):
    path = write_search_report(write_search(tmp_path, TRIALS))
    text = path.read_text()
    assert path == tmp_path / "search" / "report" / "report.md"
    head = text.splitlines()
    assert head[0] == "# Head-allocation search `toy` (preset `tiny`)"
    assert "not confirmed yet" in head[2] and "--no-confirm" in head[2]
    assert "10 trials: 6 complete, 1 pruned, 1 running, 1 failed, 1 duplicate" in text
    assert "Budget: total_heads, at most 20." in text
    rows = [r for r in table_rows(text, "## Best plans") if r[0].isdigit()]
    assert [r[1] for r in rows] == ["3", "1", "8", "0", "2"]
    assert rows[0][2:10] == ["searched", "4", "3, 5, 5, 3", "16", "4, 4, 4, 4", "–", "–", "16 (80.0% of cap)"]
    assert rows[0][10] == "2.8000" and rows[0][11] == "–"        # the loss, nothing confirmed
    assert rows[1][2] == "*ascending*" and rows[3][2] == "*constant*"
    assert "## Pareto front" not in text                              # one objective
    for name in ("history", "heads-heatmap", "importances"):
        png = path.parent / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({name}.png)" in text
    # the heat map: best on top, the three-layer plan's fourth layer blank
    heat = read_csv(path.parent / "heads-heatmap.csv")
    assert [r["trial"] for r in heat] == ["3", "1", "8", "0", "2"]
    assert heat[2]["layer2"] == "4" and heat[2]["layer3"] == ""
    # the history: complete and pruned trials, the best so far only falling
    history = read_csv(path.parent / "history.csv")
    assert [r["trial"] for r in history] == ["0", "1", "2", "3", "4", "7", "8"]
    assert [float(r["best_so_far"]) for r in history if r["state"] == "complete"] == [3.0, 2.9, 2.9, 2.8, 2.8, 2.8]


def test_a_searched_learning_rate_is_shown_beside_each_plan(tmp_path):
    trials = [{**t, "lr": 0.001 * (t["number"] + 1)} for t in TRIALS]
    text = write_search_report(write_search(tmp_path, trials)).read_text()
    header = next(line for line in text.splitlines() if line.startswith("| rank |"))
    assert "| budget use (total_heads) | lr | loss |" in header
    rows = [r for r in table_rows(text, "## Best plans") if r[0].isdigit()]
    assert [(r[1], r[10]) for r in rows] == [("3", "0.0040"), ("1", "0.0020"), ("8", "0.0090"), ("0", "0.0010"),
                                             ("2", "0.0030")]


def test_importances_per_param_and_per_layer_in_the_report(tmp_path):
    text = write_search_report(write_search(tmp_path, TRIALS, optuna_trials=30)).read_text()
    params = {r[0].strip("`"): float(r[1]) for r in table_rows(text, "| param |")}
    layers = {r[0]: float(r[1]) for r in table_rows(text, "| layer |")}
    assert set(params) == {"depth", "layer0.heads", "layer0.kv_heads", "layer1.heads", "layer2.heads"}
    assert sum(params.values()) == pytest.approx(1, abs=1e-3)
    assert layers["layer 0"] == pytest.approx(params["layer0.heads"] + params["layer0.kv_heads"], abs=2e-4)
    assert layers["depth"] == pytest.approx(params["depth"], abs=1e-4)
    # the loss is mostly layer 0's heads, then depth, by construction
    assert sorted(params, key=params.get)[-2:] == ["depth", "layer0.heads"]
    assert max(layers, key=layers.get) == "layer 0"


def test_one_complete_trial_says_why_there_are_no_importances(tmp_path):
    trials = [trial(0, [4, 4], 3.0, named="constant"), trial(1, [2, 6], 3.4, state="pruned"),
              trial(2, [1, 1], state="failed"), trial(3, [4, 4], 3.0, state="duplicate", duplicate_of=0)]
    path = write_search_report(write_search(tmp_path, trials, optuna_trials=1))
    text = path.read_text()
    assert "No importances: they need at least 2 complete trials and the Optuna study has 1." in text
    assert (path.parent / "history.png").is_file() and (path.parent / "heads-heatmap.png").is_file()
    assert "The search has no complete constant trial" not in text   # nothing confirmed: no search gain asked


def test_no_optuna_store_is_said(tmp_path):
    out = write_search(tmp_path, TRIALS)
    (out / "optuna.db").unlink()
    (out / "search.toml").write_text('storage = "postgresql://me:secret@db.example/hw"\n')
    text = write_search_report(out).read_text()
    assert "No importances: the Optuna study `headwise-search` cannot be opened from" in text
    assert "secret" not in text and "me:***@" in text
    (out / "search.toml").unlink()
    assert "there is no `optuna.db` and no `storage`" in write_search_report(out).read_text()


def test_several_objectives_get_a_pareto_front(tmp_path):
    out = write_search(tmp_path, TRIALS, objectives=(("loss", "minimize"), ("params", "minimize")))
    path = write_search_report(out)
    text = path.read_text()
    # (loss, params) of the complete trials: 0 (3.0, 900), 1 (2.9, 950), 2 (3.1, 800), 3 (2.8, 1200),
    # 7 (2.85, 1200), 8 (2.95, 700): 7 is beaten by 3, 0 by 8 (2.95 < 3.0, 700 < 900), 2 by 8
    front = table_rows(text, "## Pareto front")
    assert [r[0] for r in front] == ["3", "1", "8"]
    assert front[0][4:] == ["2.8000", "1,200"]          # a budget metric as an objective: a whole number
    rows = {r["trial"]: r["on_front"] for r in read_csv(path.parent / "pareto.csv")}
    assert {t for t, on in rows.items() if on == "True"} == {"3", "1", "8"}
    assert (path.parent / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert text.count("| param | loss | params |") == 1


def test_a_missing_trials_file_is_one_line(tmp_path):
    with pytest.raises(HeadwiseError, match="not a search folder"):
        write_search_report(tmp_path)
    (tmp_path / "trials.json").write_text("{}")
    with pytest.raises(HeadwiseError, match="not a search's trials file"):
        write_search_report(tmp_path)


# --------------------------------------------------------------------------- the confirmation

BASE = [3.0, 3.1, 3.2, 3.3, 3.4]           # constant's final loss per seed
GAINS = [0.01, 0.02, 0.03, 0.04, 0.05]     # best-1's gains: mean 0.03, 95% t interval 0.03 +- 0.0196324


def write_confirm(search: Path, gains: list[float], heads=(3, 5, 5, 3), claims: bool = True) -> None:
    """``search/confirm``: best-1 (the plan ``heads``) and constant on five paired seeds, with
    the claim the search declares (none: the search's best was the baseline)."""
    search.mkdir(parents=True, exist_ok=True)
    variants = {"best-1": (Plan.explicit(heads, [4] * len(heads)), gains),
                "constant": (Plan.explicit([4] * 4, [4] * 4), None)}
    spec = search / "confirm.toml"
    spec.write_text(tomli_w.dumps({
        "name": "toy-confirm", "seeds": 5, "base": tiny_nearest_config(100, 10, 10),
        "variants": [{"name": n, "set": {"model.heads": [k + 1]}} for k, n in enumerate(variants)],
        "claims": [{"name": "the search's best beats constant", "pairs": [["best-1", "constant"]]}] if claims else []}))
    study = load_study(str(spec))
    out = search / "confirm"
    save_study(study, out, 5)
    for v in study.variants:
        plan, g = variants[v.name]
        for seed in range(5):
            loss = BASE[seed] - (g[seed] if g else 0.0)
            summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=1000,
                                 plan=plan, steps=100, tokens=1600, tokens_per_step=16)
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, [{"step": 100, "eval_loss": loss}], seed)


def test_the_confirmation_verdict_leads_with_the_share_that_survived(tmp_path):
    out = write_search(tmp_path, TRIALS)
    write_confirm(out, GAINS)
    text = write_search_report(out).read_text()
    top = text.splitlines()[2]
    assert top.startswith("**Confirmation: `best-1` vs `constant`: gain 0.0300 [0.0104, 0.0496] (95%) on 5 paired "
                          "seeds, verdict superior.**")
    # the search's gain: constant's 3.0 - the best's 2.8 = 0.2, of which 0.03 survived
    assert "(trial 3 vs constant's trial 0, one run each, loss): +0.2; 15% of the search's gain survived" in text
    best = [r for r in table_rows(text, "## Best plans") if r[0].isdigit()]
    assert best[0][-1] == "0.0300 [0.0104, 0.0496]" and best[1][-1] == "–"


def test_a_confirmation_that_flips_the_sign(tmp_path):
    out = write_search(tmp_path, TRIALS)
    write_confirm(out, [-g for g in GAINS])
    text = write_search_report(out).read_text()
    assert "verdict inferior.**" in text.splitlines()[2]
    assert "the sign flipped, constant beats the search's best at confirmation (-0.03" in text


def test_a_confirmation_without_completed_pairs_is_not_confirmed_yet(tmp_path):
    out = write_search(tmp_path, TRIALS)
    write_confirm(out, GAINS)
    for seed in range(5):
        (run_dir(out / "confirm", "constant", seed) / "summary.json").unlink()
    text = write_search_report(out).read_text()
    assert "**Confirmation: not confirmed yet.** The confirmation study in `confirm/` has no completed pair" in text


def test_a_baseline_that_ran_no_trial_and_a_search_without_a_budget(tmp_path):
    """A named plan outside the space runs no trial: the search has no gain to compare, and says why."""
    trials = [t for t in TRIALS if t["named"] != "constant"]
    named = [{"name": "constant", "heads": [4, 4, 4, 4], "in_space": False, "note": "outside the depth range"}]
    out = write_search(tmp_path, trials, budget=None, named=named)
    write_confirm(out, GAINS)
    text = write_search_report(out).read_text()
    assert "verdict superior.**" in text.splitlines()[2]
    assert ("The search has no complete trial of `constant` at its fidelity to take the search's gain from "
            "(outside the depth range).") in text
    assert "Budget: none." in text
    header = next(line for line in text.splitlines() if line.startswith("| rank |"))
    assert "| budget use | loss | confirmed vs constant |" in header


def test_a_search_whose_confirmation_is_off_says_so_instead_of_suggesting_a_rerun(tmp_path):
    search = write_search(tmp_path, TRIALS)
    (search / "search.toml").write_text("[definition.confirm]\nenabled = false\n")
    head = write_search_report(search).read_text().splitlines()
    assert head[2].startswith("**Confirmation: none.**") and "--no-confirm" not in head[2]


def test_a_confirmation_without_a_claim_is_not_waiting_for_runs(tmp_path):
    """The search's best was the baseline (top_k 1): the confirmation declares no claim, so there is
    no pair to wait for; the report must not ask for a rerun that would change nothing."""
    out = write_search(tmp_path, TRIALS)
    write_confirm(out, GAINS, claims=False)
    top = write_search_report(out).read_text().splitlines()[2]
    assert "not confirmed yet" not in top and "rerun" not in top
    assert top.startswith("**Confirmation: no claim.**")


def test_a_store_of_other_objectives_than_the_trials_file_says_so():
    """The Optuna study optimises two objectives, trials.json names one: no importances, and why."""
    import optuna

    from headwise.search.report import importances

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(directions=["minimize", "minimize"])
    for x in (1.0, 2.0):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, values=[x, -x],
                                                  distributions={"x": optuna.distributions.FloatDistribution(0, 3)}))
    assert importances(study, [LOSS]) == ([], "the Optuna study has 2 objectives and `trials.json` 1")
