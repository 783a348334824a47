"""What the search's sampler draws (issue 44): each parameter is the plan's own value over a range
that is the same in every trial, a value that misses the budget is repaired to the nearest that
keeps it (hand-worked), the params Optuna stores are the plan's and the repairs are recorded; the
learning rate drawn with the plan reaches the trial's run config, its record and the
confirmation; one job under a seed draws the same trials every time; several objectives take the
confirmed plans along the Pareto front (hand-worked, and against Optuna's own NSGA-II code)."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from headwise.errors import HeadwiseError
from headwise.search.confirm import confirm_raw, top_plans
from headwise.search.pareto import crowding_distance, non_dominated_sort, pareto_select
from headwise.search.space import nearest
from headwise.search.store import PARAMETERS, check_store, draw, open_study
from headwise.search.trials import trial_record
from test_search_driver import write_search
from test_search_space import CASES, search

#: 3 layers of 1, 2, 4, 8 or 16 heads (d_model 16), 12 heads in all
TARGET = CASES["heads-target"]


def run_trials(s, n: int, *, jobs: int = 1) -> optuna.Study:
    """``n`` trials of search ``s``, ``jobs`` at a time as the driver runs them (each drawn when it
    is asked, all told when the batch ends), told a made-up loss (no training)."""
    study = open_study(s, optuna.storages.InMemoryStorage())
    while len(study.trials) < n:
        batch = [(trial, *draw(s, trial)) for trial in (study.ask() for _ in range(min(jobs, n - len(study.trials))))]
        for trial, plan, lr in batch:
            study.tell(trial, sum((i + 1) * h for i, h in enumerate(plan.heads)) / 10 + (lr or 0))
    return study


# ---- the parameters and their repair -----------------------------------------------------------

def test_nearest_on_a_log_and_a_linear_scale_takes_the_smaller_on_a_tie():
    assert nearest([1, 2, 4, 8], 3, log=True) == 4       # log 3/2 = 0.41 > log 4/3 = 0.29
    assert nearest([1, 2, 4, 8], 3, log=False) == 2      # a tie on a linear scale: the smaller
    assert nearest([2, 8], 4, log=True) == 2             # a tie on a log scale: the smaller
    assert nearest([2, 3, 7], 6, log=False) == 7


def test_a_layers_parameter_is_its_head_count_and_a_value_that_misses_the_budget_is_repaired():
    s = search(*TARGET)
    # every layer's parameter ranges over every count the space offers, in every trial
    assert [s.space.choices(f"layer{i}.heads") for i in range(3)] == [[1, 2, 4, 8, 16]] * 3
    assert s.space.decode({"layer0.heads": 4, "layer1.heads": 4, "layer2.heads": 4}.__getitem__).heads == (4, 4, 4)
    assert s.space.decode({"layer0.heads": 2, "layer1.heads": 8, "layer2.heads": 2}.__getitem__).heads == (2, 8, 2)
    # 16 leaves no 12-head plan: 8 is the nearest count that does (8 + 2 + 2); after 8, only 2 + 2
    # completes 12, so layer 1's 8 becomes 2 and layer 2's 1 becomes 2
    drawn = {"layer0.heads": 16, "layer1.heads": 8, "layer2.heads": 1}
    assert s.space.decode(drawn.__getitem__).heads == (8, 2, 2)
    # the sampler's repair, one value at a time after the ones before it, is the same
    assert s.space.repair({}, "layer0.heads", 16) == 8
    assert s.space.repair({"layer0.heads": 8}, "layer1.heads", 8) == 2
    assert s.space.repair({"layer0.heads": 8, "layer1.heads": 2}, "layer2.heads", 1) == 2
    assert s.space.repair({}, "optim.lr", 0.003) == 0.003  # not a value of the plan: kept
    # a value between two counts is a count's neighbour, on a log scale: 3 -> 4 (then 4 + 4 + 4)
    assert s.space.decode({"layer0.heads": 3, "layer1.heads": 3, "layer2.heads": 3}.__getitem__).heads == (4, 4, 4)


def test_a_depth_that_misses_the_budget_is_repaired_to_one_that_keeps_it():
    s = search(*CASES["params-cap-depth"])
    # the parameter ranges over every depth; under this cap only one layer of few heads fits
    assert s.space.choices("depth") == [1, 2, 3] and s.space.feasible_depths == [1]
    for depth in (1, 2, 3):
        assert s.space.decode(lambda name: depth if name == "depth" else 1).heads == (1,)


def test_the_params_optuna_stores_are_the_plans_and_the_repairs_are_recorded():
    s = search(*TARGET, seed=3)
    study = run_trials(s, 30)
    repaired = 0
    for trial in study.trials:
        plan = s.space.decode(trial.params.__getitem__)
        assert sum(plan.heads) == 12 and trial.params == s.space.encode(plan)  # the plan's own values
        for name, proposed in study.sampler.repairs.get(trial.number, {}).items():
            assert proposed != trial.params[name] and 1 <= proposed <= 16
            repaired += 1
    assert repaired > 0
    frame = study.trials_dataframe()
    heads = [tuple(s.space.decode(t.params.__getitem__).heads) for t in study.trials]
    assert list(zip(*(frame[f"params_layer{i}.heads"] for i in range(3)))) == heads  # the counts themselves


def test_a_scaled_spaces_params_are_its_numbers_themselves():
    base = {**TARGET[0], "model": {**TARGET[0]["model"], "d_model": 192, "n_layers": 4}}
    s = search(base, {"depth": 4, "heads": "divisors", "scaling": "geometric"}, None, seed=4)
    assert s.space.choices("ratio") == [0.5, 1.0, 2.0] and s.space.choices("first.heads")[-1] == 192
    for trial in run_trials(s, 12).trials:
        assert all(v in s.space.choices(name) for name, v in trial.params.items())  # a count, a ratio
        plan = s.space.decode(trial.params.__getitem__)
        ratio, first = trial.params["ratio"], trial.params["first.heads"]
        assert plan.heads == s.space._walk(lambda name, values: {"first.heads": first, "ratio": ratio}[name]).heads


def test_a_store_of_an_earlier_headwise_is_refused_in_one_line():
    s = search(*TARGET)
    storage = optuna.storages.InMemoryStorage()
    open_study(s, storage)
    check_store(s, storage)
    study_id = storage.get_study_id_from_name("headwise-search")
    assert storage.get_study_user_attrs(study_id)["parameters"] == PARAMETERS
    storage.set_study_user_attr(study_id, "parameters", None)  # as an earlier headwise left it
    with pytest.raises(HeadwiseError, match=r"numbers in \[0, 1\].*--new"):
        check_store(s, storage)


# ---- reproducible: one job, a seed ---------------------------------------------------------------

@pytest.mark.parametrize("sampler", [None, "random", "nsga2"])
def test_one_job_under_a_seed_draws_the_same_trials_every_time(sampler):
    extra = {"seed": 5} | ({"sampler": sampler} if sampler else {})
    s = search(*TARGET, **extra)
    runs = [[t.params for t in run_trials(s, 16).trials] for _ in range(2)]
    assert runs[0] == runs[1]
    other = search(*TARGET, **{**extra, "seed": 6})
    assert [t.params for t in run_trials(other, 16).trials] != runs[0]


def test_two_jobs_draw_tpes_first_trials_as_one_job_does_and_then_differ():
    """Without the driver's startup queue (a space too large to list), TPE's first 10 trials are
    random with seed + n: asked two at a time they are the same as one at a time; from then on
    each trial's draw depends on which trials have ended."""
    s = search(*TARGET, seed=1)
    one, two = ([t.params for t in run_trials(s, 16, jobs=j).trials] for j in (1, 2))
    assert one[:10] == two[:10] and one[10:] != two[10:]


# ---- the learning rate, drawn with the plan --------------------------------------------------------

def test_the_learning_rate_reaches_the_run_config_the_record_and_the_confirmation():
    base, _, budget = TARGET
    s = search(base, {"depth": 3, "heads": "divisors", "lr": [1e-3, 1e-2]}, budget, seed=2)
    assert "optim.lr from 0.001 to 0.01 (log scale)" in s.space.parametrisation()
    study = run_trials(s, 12)
    lrs = [t.params["optim.lr"] for t in study.trials]
    assert all(1e-3 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 12
    trial = study.trials[4]
    plan, lr = s.space.decode(trial.params.__getitem__), trial.params["optim.lr"]
    assert s.trial_config(plan, lr)["optim"]["lr"] == lr and s.trial_config(plan).get("optim", {}).get("lr") != lr
    # the record carries the driver's user attribute (a copy of the trial, as the driver sets it)
    trial.user_attrs["lr"] = lr
    assert trial_record(trial, s)["lr"] == lr and trial_record(study.trials[3], s)["lr"] is None
    # the confirmation trains the best plan at its trial's rate, unless its study tunes the rate
    record = {"trials": [{"number": t.number, "state": "complete", "params": t.params, "lr": t.params["optim.lr"],
                          "values": {"loss": t.value}} for t in study.trials]}
    best = min(study.trials, key=lambda t: (t.value, t.number))
    top = top_plans(s, record)[0]
    assert top.lr == best.params["optim.lr"] and top.plan == s.space.decode(best.params.__getitem__)
    variants = {v["name"]: v["set"] for v in confirm_raw(s, [top])["variants"]}
    assert variants.pop(top.name)["optim.lr"] == top.lr
    assert len(variants) >= 2 and not any("optim.lr" in v for v in variants.values())  # the named: the base's
    tuned = search(base, {"depth": 3, "heads": "divisors", "lr": [1e-3, 1e-2]}, budget, seed=2,
                   confirm={"enabled": False, "nuisance": {"values": {"optim.lr": [1e-3, 1e-2]}}})
    assert "optim.lr" not in confirm_raw(tuned, [top])["variants"][0]["set"]


@pytest.mark.parametrize("lr", [[1e-2], [1e-2, 1e-3], [0, 1e-2]])
def test_an_lr_range_that_is_not_one_is_one_line(lr):
    with pytest.raises(HeadwiseError, match=r"lr .*\[low, high\]"):
        search(TARGET[0], {"depth": 3, "heads": "divisors", "lr": lr}, None)


def test_the_driver_trains_each_trial_at_its_drawn_rate_and_records_it(tmp_path, monkeypatch):
    """The driver's own path, its runs replaced by one that reports the rate it was given."""
    from headwise.search import driver as driver_module
    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.execute import TrialOutcome
    from headwise.search.store import open_storage
    from headwise.search.trials import write_record

    class Reported:
        def __init__(self, search, job, *args):
            self.lr = job.spec.config["optim"]["lr"]

        def run(self):
            return TrialOutcome("complete", values=[self.lr], steps=30)

    monkeypatch.setattr(driver_module, "TrialRun", Reported)
    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", trials=5,
                                                    space={"depth": [1, 2], "heads": [1, 2, 4], "lr": [1e-3, 1e-1]})))
    s = resolve_search(raw, source)
    study = open_study(s, open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    driver_module.enqueue_named(s, study)
    driver_module.Driver(s, tmp_path, study, jobs=1, threads=1, main=True, echo=lambda line: None).run()
    trials = write_record(tmp_path, s, study.trials)["trials"]
    assert [t["state"] for t in trials] == ["complete"] * 5 and trials[0]["named"] == "one-two"
    for t in trials:  # the rate the run trained at is the one drawn, recorded and reported
        assert t["lr"] == t["params"]["optim.lr"] == t["values"]["loss"]


# ---- several objectives: the Pareto front ----------------------------------------------------------

#: (loss, KV bytes), both minimised: A B C D trade off; E is beaten by B alone, F by C and D
POINTS = [(1.0, 8), (2.0, 4), (3.0, 2), (4.0, 1), (2.5, 6), (5.0, 5)]
MIN2 = ["minimize", "minimize"]


def test_non_dominated_sorting_and_crowding_by_hand():
    assert non_dominated_sort(POINTS, MIN2) == [[0, 1, 2, 3], [4, 5]]
    # loss spans 3 and KV bytes 7 on the first front: B (3 - 1)/3 + (8 - 2)/7, C (4 - 2)/3 + (4 - 1)/7
    distance = crowding_distance(POINTS, [0, 1, 2, 3])
    assert distance[0] == distance[3] == float("inf")
    assert distance[1] == pytest.approx(2 / 3 + 6 / 7) and distance[2] == pytest.approx(2 / 3 + 3 / 7)
    # three plans: both ends of the front, then the most isolated (B); by loss alone: A, B, E
    assert pareto_select(POINTS, MIN2, 3) == [0, 3, 1]
    assert pareto_select(POINTS, MIN2, 5) == [0, 1, 2, 3, 4]  # a whole front, then the second's earlier end
    # maximising both turns it round: F and E lead
    assert non_dominated_sort(POINTS, ["maximize", "maximize"])[0] == [0, 4, 5]


def test_sorting_and_crowding_agree_with_optunas_nsga2():
    from optuna.samplers.nsgaii._elite_population_selection_strategy import _calc_crowding_distance
    from optuna.study._multi_objective import _fast_non_domination_rank

    rng = np.random.default_rng(0)
    points = [tuple(p) for p in rng.random((40, 3))]
    ranks = _fast_non_domination_rank(np.array(points))
    fronts = non_dominated_sort(points, ["minimize"] * 3)
    assert [sorted(np.flatnonzero(ranks == r)) for r in range(len(fronts))] == fronts
    trials = [optuna.trial.create_trial(values=list(points[i]), params={}, distributions={}) for i in fronts[0]]
    for number, t in enumerate(trials):
        t.number = number
    theirs = _calc_crowding_distance(list(trials))
    mine = crowding_distance(points, fronts[0])
    assert [mine[i] for i in fronts[0]] == pytest.approx([theirs[n] for n in range(len(trials))])


def test_several_objectives_confirm_plans_along_the_pareto_front():
    s = search(*TARGET, objectives=[{"metric": "loss"}, {"metric": "kv_bytes_per_token"}],
               confirm={"top_k": 3, "seeds": 2, "baseline": "ascending"})
    plans = [p for p in s.space.plans()][:6]
    record = {"trials": [{"number": n, "state": "complete", "params": s.space.encode(p),
                          "values": {"loss": loss, "kv_bytes_per_token": kv}}
                         for n, (p, (loss, kv)) in enumerate(zip(plans, POINTS))]}
    top = top_plans(s, record)
    # A, B and D along the front (not E, the third by loss alone), named best first by loss
    assert [(t.name, t.plan) for t in top] == [("best-1", plans[0]), ("best-2", plans[1]), ("best-3", plans[3])]
