"""TPE's startup trials (issue 44): after the named plans the driver queues distinct plans drawn
uniformly from the space's list, up to TPE's 10 startup trials (no more than the search's), once
per store, the same for the same seed; random sampling and NSGA-II queue only the named plans, and
a space too large to list keeps Optuna's random startup."""

from __future__ import annotations

import dataclasses
from collections import Counter

import optuna
import pytest

from headwise.search import driver
from headwise.search.store import draw, open_storage, open_study
from test_search_space import GPT, brute_force, search

#: 4 layers of 1, 2, 4, 8 or 16 heads, 16 in all: 13 plans (4 x 4, and the 12 orders of 8, 4, 2, 2)
SPACE = ({"depth": 4, "heads": "divisors"}, {"metric": "total_heads", "target": 16})
NAMED = [{"name": "ascending", "heads": [2, 2, 4, 8]}, {"name": "constant", "heads": [4, 4, 4, 4]}]


def startup_search(**extra):
    return search(GPT, *SPACE, **{"trials": 24, "seed": 3, "named": NAMED, **extra})


def queued(s, storage=None) -> list[optuna.trial.FrozenTrial]:
    """The trials the driver queues in a fresh store (or ``storage``) for search ``s``."""
    study = open_study(s, storage or optuna.storages.InMemoryStorage())
    driver.enqueue_named(s, study)
    return study.get_trials(deepcopy=False)


def heads(trials) -> list[tuple[int, ...]]:
    """Each trial's heads per layer: its params, or the values it is queued with."""
    return [tuple((t.params or t.system_attrs["fixed_params"])[f"layer{i}.heads"] for i in range(4)) for t in trials]


def test_the_named_plans_then_distinct_plans_of_the_space_fill_tpes_ten_startup_trials():
    s = startup_search()
    plans = {p.heads for p in brute_force(s)}  # every plan whose spec meets the budget, built one by one
    assert len(plans) == 13
    trials = queued(s)
    assert all(t.state.name == "WAITING" for t in trials) and len(trials) == driver.STARTUP == 10
    assert [t.user_attrs for t in trials[:2]] == [{"named": "ascending"}, {"named": "constant"}]
    assert all(t.user_attrs == {"startup": "uniform"} for t in trials[2:])
    drawn = heads(trials[2:])
    assert len(set(drawn)) == 8 and set(drawn) <= plans - {(2, 2, 4, 8), (4, 4, 4, 4)}


def test_the_same_seed_queues_the_same_plans_another_seed_others_and_fewer_trials_the_first_of_them():
    first = heads(queued(startup_search()))
    assert heads(queued(startup_search())) == first
    assert heads(queued(startup_search(seed=4))) != first
    # a search of 5 trials queues 3 after the named plans, the first 3 of the same draw
    assert heads(queued(startup_search(trials=5))) == first[:5]
    assert heads(queued(startup_search(trials=2))) == first[:2]  # the named plans alone


def test_the_first_startup_plan_is_uniform_over_the_plans_not_named():
    """The first draw over 1,100 seeds: each of the 11 plans about 100 times (a binomial sd of 9.5),
    where a draw repaired per layer would favour some, and the first of the list would always win."""
    s = startup_search()
    counts = Counter()
    for seed in range(1100):
        config = s.config.model_copy(update={"seed": seed})
        counts.update(p.heads for p in driver.startup_plans(dataclasses.replace(s, config=config),
                                                            {n.plan for n in s.named}, 1))
    assert len(counts) == 11 and all(60 < n < 140 for n in counts.values()), counts


def test_a_resumed_store_queues_nothing_again(tmp_path):
    s = startup_search()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = queued(s, open_storage(url))
    again = queued(s, open_storage(url))  # a second driver, or a rerun, opens the same store
    assert len(again) == 10 and heads(again) == heads(first)


@pytest.mark.parametrize("sampler", ["random", "nsga2"])
def test_random_sampling_and_nsga2_queue_only_the_named_plans(sampler):
    trials = queued(startup_search(sampler=sampler))
    assert [t.user_attrs for t in trials] == [{"named": "ascending"}, {"named": "constant"}]


def test_a_space_too_large_to_list_keeps_optunas_random_startup(monkeypatch):
    monkeypatch.setattr(driver, "LISTED", 12)  # the space holds 13 plans
    assert [t.user_attrs for t in queued(startup_search())] == [{"named": "ascending"}, {"named": "constant"}]


def test_the_startup_trials_are_the_same_asked_one_or_two_at_a_time():
    """As the driver asks them: each trial drawn when asked, a batch told when it ends."""
    s = startup_search()
    runs = []
    for jobs in (1, 2):
        study = open_study(s, optuna.storages.InMemoryStorage())
        driver.enqueue_named(s, study)
        while len(study.trials) < 10:
            batch = [study.ask() for _ in range(jobs)]
            for trial in batch:
                plan, _ = draw(s, trial)
                study.tell(trial, float(sum((i + 1) * h for i, h in enumerate(plan.heads))))
        runs.append(heads(study.trials))
    assert runs[0] == runs[1] == heads(queued(s))


def test_the_trials_record_says_which_trials_were_named_and_which_startup_plans():
    from headwise.search.trials import build_record

    s = startup_search()
    study = open_study(s, optuna.storages.InMemoryStorage())
    driver.enqueue_named(s, study)
    for _ in range(3):
        trial = study.ask()
        draw(s, trial)
        study.tell(trial, 1.0)
    record = build_record(s, study.get_trials(deepcopy=False))["trials"]
    assert [(t["named"], t["startup"]) for t in record] == [("ascending", None), ("constant", None),
                                                            (None, "uniform")]
