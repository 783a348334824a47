"""The search's space is feasible by construction: every number in [0, 1) decodes to a plan that
meets the budget, every plan that meets it is reachable (brute force over small spaces: the
reachable set equals the feasible set), and the budget the space computes is the one the plan's
spec has (:mod:`headwise.params`; parameters as ``Transformer(spec)`` counts them)."""

from __future__ import annotations

import copy
import itertools
import random

import pytest

from headwise.errors import HeadwiseError
from headwise.params import count_params, flops_per_token, kv_cache_bytes_per_token
from headwise.plans import Plan, Scheme
from headwise.search.definition import resolve_search
from headwise.train.config import resolve_run_model
from helpers import one_line_error, one_thread  # noqa: F401  (one torch thread)

GPT = {"model": {"preset": "tiny-lm", "d_model": 16, "n_layers": 2, "max_seq_len": 32},
       "task": {"kind": "lm", "source": "tinystories-train-sample.txt", "validation": "tinystories-valid-sample.txt",
                "tokenizer": "bpe:300", "block_size": 32},
       "train": {"steps": 5, "device": "cpu"}}
LLAMA = {**GPT, "model": {"preset": "llama-tiny", "d_model": 16, "head_dim": 4, "max_seq_len": 32,
                          "mlp_hidden": 32}}


def search(base: dict, space: dict, budget: dict | None, **extra):
    raw = {"name": "s", "trials": 4, "base": copy.deepcopy(base), "space": space,
           "confirm": {"enabled": False}, **extra}
    if budget is not None:
        raw["budget"] = budget
    return resolve_search(raw, "test")


#: small spaces of each budget kind, with an interval or a target where bounds cannot decide
CASES = {
    "heads-target": (GPT, {"depth": 3, "heads": "divisors"}, {"metric": "total_heads", "target": 12}),
    "params-cap-depth": (GPT, {"depth": [1, 3], "heads": [1, 2, 4, 8]}, {"metric": "params", "max": 11000}),
    "flops-interval": (GPT, {"depth": [2, 3], "heads": [1, 2, 4], "head_dim": [4, 8]},
                       {"metric": "flops_per_token", "min": 84_000, "max": 105_000}),
    "kv-cap-gqa": (LLAMA, {"depth": 2, "heads": [2, 4], "kv_heads": "divisors", "mlp_ratio": [1.0, 2.0]},
                   {"metric": "kv_bytes_per_token", "max": 160}),
    "params-floor": (GPT, {"depth": [1, 2], "heads": [2, 4], "mlp_ratio": [1.0, 4.0]}, {"metric": "params", "min": 8600}),
}


def brute_force(s) -> set[Plan]:
    """Every plan of the space's options whose spec meets the budget, by building each spec."""
    out = set()
    for depth in s.space.depths:
        options = [[o.choice for o in s.space._options_at(depth, i)] for i in range(depth)]
        for layers in itertools.product(*options):
            plan = Plan(Scheme.EXPLICIT, layers)
            if s.config.budget.allows(s.budget_of(plan)[s.config.budget.metric]):
                out.add(plan)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_number_decodes_to_a_feasible_plan_and_every_feasible_plan_is_reachable(case):
    s = search(*CASES[case])
    feasible = brute_force(s)
    assert feasible and set(s.space.plans()) == feasible and s.space.count() == len(feasible)
    assert_feasible_by_construction(s, feasible)


def assert_feasible_by_construction(s, feasible, check=lambda plan, draws: None):
    """Every feasible plan is reachable (its own values decode to it), and 300 random draws over
    each parameter's range (edges included) decode to feasible plans whose predicted budget is the
    spec's; ``check(plan, draws)`` adds a space's own checks."""
    for plan in feasible:
        assert s.space.decode(s.space.encode(plan).__getitem__) == plan
    rng = random.Random(0)

    def value(name):
        low, high = s.space.choices(name)[0], s.space.choices(name)[-1]
        return rng.choice([low, high, rng.uniform(low, high)])

    for _ in range(300):
        draws: dict[str, float] = {}
        plan = s.space.decode(lambda name: draws.setdefault(name, value(name)))
        assert plan in feasible
        assert s.space.predicted(plan) == s.budget_of(plan)[s.config.budget.metric]
        check(plan, draws)


def test_the_budget_is_the_specs_and_the_models():
    from headwise.model import Transformer

    s = search(*CASES["kv-cap-gqa"])
    plan = next(p for p in s.space.plans() if len(set(p.kv_heads)) > 1 and len(set(p.mlp_hidden)) > 1)
    spec, _ = resolve_run_model(s.trial_config(plan))
    budget = s.budget_of(plan)
    assert budget == {"params": count_params(spec), "flops_per_token": flops_per_token(spec, 32),
                      "kv_bytes_per_token": kv_cache_bytes_per_token(spec), "total_heads": sum(plan.heads)}
    assert spec.kv_heads == list(plan.kv_heads) and spec.mlp_hidden == list(plan.mlp_hidden)
    assert budget["params"] == sum(p.numel() for p in Transformer(spec).parameters())


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_trial_trains_the_model_its_budget_is_of(case):
    """The budget (the base's spec with the plan's layers) is the budget of the model the trial's
    run config builds (the plan's dotted keys, through the run config), whose layers are the plan's."""
    s = search(*CASES[case])
    plans = list(s.space.plans())
    for plan in plans[::max(1, len(plans) // 20)]:
        spec, _ = resolve_run_model(s.trial_config(plan))
        assert spec.layers() == list(plan.layers)
        assert s.budget_of(plan) == {"params": count_params(spec), "flops_per_token": flops_per_token(spec, 32),
                                     "kv_bytes_per_token": kv_cache_bytes_per_token(spec),
                                     "total_heads": spec.total_heads}


def test_the_blog_question_every_plan_has_the_same_parameters():
    raw_base = copy.deepcopy(GPT)
    raw_base["model"]["d_model"] = 192
    raw_base["model"]["max_seq_len"] = 32
    s = search(raw_base, {"depth": 4, "heads": "divisors"}, {"metric": "total_heads", "target": 180})
    plans = list(s.space.plans())
    assert len(plans) == s.space.count() > 50
    assert len({s.budget_of(p)["params"] for p in plans[::7]}) == 1
    assert all(sum(p.heads) == 180 for p in plans)


@pytest.mark.parametrize("space, budget, says", [
    ({"depth": 2, "heads": [3, 5]}, None, "allows no layer"),
    ({"depth": 2, "heads": [1, 2]}, {"metric": "total_heads", "target": 9}, "no plan of the space meets the budget"),
    ({"depth": [3, 2], "heads": [1]}, None, "min <= max"),
    ({"depth": 2, "heads": []}, None, "empty list"),
    ({"depth": 2, "heads": [2]}, {"metric": "tokens_per_s", "min": 100}, "measured by training"),
    ({"depth": 2, "heads": [2]}, {"metric": "params", "max": 10, "target": 5}, "not both"),
])
def test_a_space_or_budget_that_allows_nothing_is_one_line(space, budget, says):
    assert says in one_line_error(search, GPT, space, budget)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["mlp_ratio", "geometric-ratio", "named-ratio"])
def test_a_ratio_that_is_not_finite_is_one_line(where, bad):
    """NaN passed every check of a ratio (each comparison is false) and made plans of it."""
    x, space, extra = float(bad), {"depth": 2, "heads": [2]}, {}
    if where == "mlp_ratio":
        space["mlp_ratio"] = [x]
    elif where == "geometric-ratio":
        space.update(scaling="geometric", ratio=[1.0, x])
    else:
        extra["named"] = [{"name": "n", "scheme": "ascending", "total_heads": 4, "ratio": x}]
    assert "finite number" in one_line_error(search, GPT, space, None, **extra)


def test_named_plans_default_to_the_schemes_and_say_why_one_is_not_a_trial():
    s = search(GPT, {"depth": 2, "heads": "divisors"}, {"metric": "total_heads", "target": 6})
    named = {n.name: n for n in s.named}
    assert set(named) == {"constant", "ascending", "descending"}
    assert named["ascending"].in_space and named["ascending"].plan.heads == (2, 4)
    assert named["descending"].plan.heads == (4, 2)
    assert not named["constant"].in_space and "outside the budget" in named["constant"].note  # 3 divides not 16
    for n in (named["ascending"], named["descending"]):
        assert s.space.decode(s.space.encode(n.plan).__getitem__) == n.plan
    with pytest.raises(HeadwiseError, match="objective 'bleu'"):
        search(GPT, {"depth": 2, "heads": [2]}, None, objectives=[{"metric": "bleu"}])


def test_mlp_ratios_of_one_width_are_one_choice():
    """Two ratios that round to one MLP width make one model: one plan, sampled once, not two."""
    import json

    s = search(GPT, {"depth": 2, "heads": [2, 4], "mlp_ratio": [1.0, 1.01, 2.0]}, None,
               named=[{"name": "wide", "heads": [2, 4], "mlp_ratio": 1.01}])
    plans = list(s.space.plans())
    configs = {json.dumps(s.trial_config(p), sort_keys=True) for p in plans}
    assert len(configs) == len(plans) == s.space.count() == 16
    (wide,) = s.named
    assert wide.in_space and s.space.decode(s.space.encode(wide.plan).__getitem__) == wide.plan


def test_a_layer_that_the_base_leaves_no_option_is_one_line():
    """Layer 1 of the base keeps 3 KV heads, which no head count of the space divides into: no plan,
    said in one line (without a budget too)."""
    base = copy.deepcopy(GPT)
    base["model"].update(n_layers=2, heads=[3, 3], head_dim=4, kv_heads=[1, 3])
    for budget in (None, {"metric": "params", "max": 10**9}):
        assert "multiple of the KV heads" in one_line_error(search, base, {"heads": [2, 4]}, budget, named=[])
