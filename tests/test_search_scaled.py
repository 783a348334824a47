"""A scaled space (``[space] scaling``, issue 35) sets the whole plan from a few numbers and stays
feasible by construction: the plans match hand-computed OpenELM and geometric schemes, every
number decodes to a plan within the budget, every such plan is reachable, the plans are exactly
those a brute force over every setting makes within the budget (checked on the plans' specs),
and a space or budget that allows nothing is one line."""

from __future__ import annotations

import copy
import itertools

import pytest
import tomli_w

from headwise.cli import main
from headwise.plans import Plan, Scheme, ramp
from headwise.search import load_search
from headwise.search.scaled import ScaledSpace, geometric_counts, linear_counts, snap
from helpers import one_line_error, one_thread  # noqa: F401  (one torch thread)
from test_search_space import GPT, LLAMA, assert_feasible_by_construction, search

#: the blog's model width: head counts are the divisors of 192
WIDE = copy.deepcopy(GPT)
WIDE["model"].update(d_model=192, n_layers=4)


def made(space: ScaledSpace, depth: int, **numbers) -> Plan:
    """The plan of the numbers' values (not their quantiles); ``first_heads`` names ``first.heads``."""
    wanted = {k.replace("_", ".", 1): v for k, v in numbers.items()}
    return space._walk(lambda name, values: depth if name == "depth" else wanted[name])


# ---- the maths, by hand ---------------------------------------------------------------------

def test_the_ramps_round_as_openelm_and_snap_as_the_schemes():
    # linspace 12, 40, 68, 96; 40 lies between the divisors 32 and 48 of 192: the smaller on a tie
    assert linear_counts(12, 96, 4) == [12, 40, 68, 96]
    assert [snap([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 192], t) for t in [12, 40, 68, 96]] == [12, 32, 64, 96]
    # OpenELM's make_divisible never rounds more than 10% down: 2.4 -> 3 (plain rounding: 2)
    assert linear_counts(2, 4, 6) == [2, 3, 3, 3, 4, 4]
    assert ramp(1.0, 4.0, 3) == [1.0, 2.5, 4.0]  # the MLP ratios' ramp
    assert geometric_counts(12, 2.0, 4) == [12, 24, 48, 96]
    assert geometric_counts(12, 0.5, 4) == [12, 6, 3, 1.5]


def test_linear_plans_of_the_blogs_model():
    s = search(WIDE, {"depth": 4, "heads": "divisors", "scaling": "linear"}, None)
    assert s.space.names == ["first.heads", "last.heads"]
    assert made(s.space, 4, first_heads=12, last_heads=96).heads == (12, 32, 64, 96)
    assert made(s.space, 4, first_heads=96, last_heads=12).heads == (96, 64, 32, 12)
    assert made(s.space, 4, first_heads=48, last_heads=48).heads == (48,) * 4
    # 14 x 14 settings, each its own plan (the last layer tells them apart)
    assert s.space.size() == s.space.count() == 14 * 14


def test_linear_heads_at_a_fixed_width_follow_openelms_rounding():
    base = copy.deepcopy(GPT)
    base["model"]["head_dim"] = 4
    s = search(base, {"depth": 6, "heads": [1, 2, 3, 4], "scaling": "linear"}, None)
    assert made(s.space, 6, first_heads=2, last_heads=4).heads == (2, 3, 3, 3, 4, 4)


def test_linear_mlp_ratios_and_kv_heads():
    s = search(GPT, {"depth": [3, 4], "heads": [2], "mlp_ratio": [1.0, 2.0, 3.0, 4.0], "scaling": "linear"}, None)
    assert "first.heads" not in s.space.drawn and {"first.mlp_ratio", "last.mlp_ratio"} <= s.space.drawn
    plan = made(s.space, 4, first_heads=2, last_heads=2, first_mlp_ratio=1.0, last_mlp_ratio=4.0)
    assert plan.mlp_hidden == (16, 32, 48, 64)
    # 1, 2.5, 4: 2.5 lies between the ratios 2 and 3: the smaller on a tie
    assert made(s.space, 3, first_heads=2, last_heads=2, first_mlp_ratio=1.0, last_mlp_ratio=4.0).mlp_hidden == (16, 32, 64)
    s = search(LLAMA, {"depth": 3, "heads": [1, 2, 4, 8], "kv_heads": "divisors", "scaling": "linear"}, None)
    # heads 2, 5 -> 4, 8; KV heads 1, 1.5 -> 2 (OpenELM rounds half up), 2
    plan = made(s.space, 3, first_heads=2, last_heads=8, first_kv_heads=1, last_kv_heads=2)
    assert (plan.heads, plan.kv_heads) == ((2, 4, 8), (1, 2, 2))


def test_geometric_plans_and_kv_heads_that_follow_the_ratio():
    s = search(WIDE, {"depth": 4, "heads": "divisors", "scaling": "geometric"}, None)
    assert s.space.names == ["first.heads", "ratio"] and s.space.ratios == [0.5, 1.0, 2.0]
    assert made(s.space, 4, first_heads=12, ratio=2.0).heads == (12, 24, 48, 96)
    assert made(s.space, 4, first_heads=12, ratio=0.5).heads == (12, 6, 3, 1)  # 1.5: the smaller on a tie
    assert made(s.space, 4, first_heads=12, ratio=1.0).heads == (12,) * 4
    s = search(LLAMA, {"depth": 3, "heads": [1, 2, 4, 8], "kv_heads": "divisors", "scaling": "geometric",
                       "ratio": [2.0]}, None)
    assert "ratio" not in s.space.drawn  # one ratio: nothing to draw
    plan = made(s.space, 3, first_heads=2, ratio=2.0, first_kv_heads=1)
    assert (plan.heads, plan.kv_heads) == ((2, 4, 8), (1, 2, 4))


def test_the_blogs_question_geometric_plans_at_180_heads():
    """At 180 heads over 4 layers of width 192 the geometric space holds the ascending and
    descending plans, and the default named ascending scheme is one of its trials."""
    s = search(WIDE, {"depth": 4, "heads": "divisors", "scaling": "geometric"}, {"metric": "total_heads", "target": 180})
    assert [p.heads for p in s.space.plans()] == [(12, 24, 48, 96), (96, 48, 24, 12)]
    named = {n.name: n for n in s.named}
    assert named["ascending"].in_space and named["ascending"].plan.heads == (12, 24, 48, 96)
    assert s.space.decode(s.space.encode(named["ascending"].plan).__getitem__) == named["ascending"].plan
    assert not named["constant"].in_space and "outside the budget" in named["constant"].note


# ---- feasible by construction, against brute force ------------------------------------------

CASES = {
    "params-cap-linear": (GPT, {"depth": [1, 3], "heads": [1, 2, 4, 8], "scaling": "linear"},
                          {"metric": "params", "max": 11808}),
    "flops-interval-linear-mlp": (GPT, {"depth": [2, 3], "heads": [1, 2, 4], "mlp_ratio": [1.0, 2.0, 4.0],
                                        "scaling": "linear"}, {"metric": "flops_per_token", "min": 73728, "max": 86592}),
    "kv-cap-geometric-gqa": (LLAMA, {"depth": [1, 3], "heads": [2, 4, 8], "kv_heads": "divisors", "mlp_ratio": [1.0, 2.0],
                                     "scaling": "geometric"}, {"metric": "kv_bytes_per_token", "max": 160}),
    "params-floor-linear-gqa": (LLAMA, {"depth": 3, "heads": [1, 2, 4], "kv_heads": "divisors", "scaling": "linear"},
                                {"metric": "params", "min": 8752}),
    "heads-target-geometric": (GPT, {"depth": [2, 4], "heads": "divisors", "scaling": "geometric", "ratio": [0.5, 2.0]},
                               {"metric": "total_heads", "target": 28}),
}


def value(space: ScaledSpace, layer, dim: str):
    """A layer's value of a scaled number: its heads or KV heads, or the MLP ratio the space offered
    for its width."""
    return space.mlp_ratios[layer.mlp_hidden] if dim == "mlp_ratio" else getattr(layer, dim)


def brute_force(s) -> set[Plan]:
    """Every plan whose spec meets the budget among those every setting makes, taking each first
    and last value from all the layer's options (not only those under its heads) and keeping the
    settings whose first and last layers have them."""
    space, config = s.space, s.config.space
    dims = ["heads"] + [d for d in ("kv_heads", "mlp_ratio") if getattr(config, d) is not None]
    out = set()
    for depth in space.depths:
        layers = [space._options_at(depth, i) for i in range(depth)]
        values = [{d: sorted({value(space, o.choice, d) for o in opts}) for d in dims} for opts in layers]
        pairs = []
        for d in dims:
            if config.scaling == "geometric" and d == "heads":
                pairs.append(list(itertools.product(values[0][d], space.ratios)))
            elif config.scaling == "geometric" and d == "kv_heads":
                pairs.append([(v, None) for v in values[0][d]])
            else:
                pairs.append(list(itertools.product(values[0][d], values[-1][d])))
        for setting in itertools.product(*pairs):
            numbers = dict(zip(dims, setting))
            chosen = [list(opts) for opts in layers]
            for d, (first, second) in numbers.items():
                if d == "mlp_ratio":
                    targets = ramp(first, second, depth)
                elif config.scaling == "linear":
                    targets = linear_counts(first, second, depth)
                else:
                    targets = geometric_counts(first, second if d == "heads" else numbers["heads"][1], depth)
                for i, t in enumerate(targets):
                    want = snap(sorted({value(space, o.choice, d) for o in chosen[i]}), t)
                    chosen[i] = [o for o in chosen[i] if value(space, o.choice, d) == want]
            plan = Plan(Scheme.EXPLICIT, tuple(opts[0].choice for opts in chosen))
            ends_match = all(value(space, plan.layers[0], d) == first and (second is None or config.scaling == "geometric"
                                                                   and d == "heads" or value(space, plan.layers[-1], d) == second)
                             for d, (first, second) in numbers.items())
            if ends_match and s.config.budget.allows(s.budget_of(plan)[s.config.budget.metric]):
                out.add(plan)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_number_decodes_to_a_feasible_plan_and_every_feasible_plan_is_reachable(case):
    s = search(*CASES[case])
    assert isinstance(s.space, ScaledSpace)
    feasible = brute_force(s)
    plans = list(s.space.plans())
    assert feasible and len(plans) == len(set(plans)) == s.space.count() == len(feasible) < s.space.size()
    assert set(plans) == feasible

    def check(plan, draws):
        assert set(draws) == s.space.drawn | ({"depth"} if len(s.space.depths) > 1 else set())
        assert s.trial_config(plan)["model"]["n_layers"] == plan.n_layers

    assert_feasible_by_construction(s, feasible, check)


def test_a_plan_the_scaling_cannot_make_is_no_trial():
    s = search(WIDE, {"depth": 4, "heads": "divisors", "scaling": "linear"}, {"metric": "total_heads", "max": 210},
               named=[{"name": "halving", "heads": [96, 48, 24, 12]}, {"name": "ramp", "heads": [96, 64, 32, 12]}])
    named = {n.name: n for n in s.named}
    assert not named["halving"].in_space and "not a plan the linear scaling makes" in named["halving"].note
    assert named["ramp"].in_space
    wide = next(o.choice for o in s.space._options_at(4, 0) if o.choice.heads == 96)
    assert "misses the budget total_heads <= 210" in one_line_error(s.space.encode, Plan(Scheme.EXPLICIT, (wide,) * 4))
    assert "outside the space's 4..4" in one_line_error(s.space.encode, Plan(Scheme.EXPLICIT, (wide,) * 2))


# ---- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("space, budget, says", [
    ({"depth": 2, "heads": [1, 2], "scaling": "linear"}, {"metric": "total_heads", "target": 5},
     ("no plan of the space meets the budget", "total_heads run from 2 to 4")),
    ({"depth": 2, "heads": [3, 5], "scaling": "geometric"}, None, "allows no layer"),
    ({"depth": 2, "heads": [2], "ratio": [2.0]}, None, "ratio"),
    ({"depth": 2, "heads": [2], "scaling": "linear", "ratio": [2.0]}, None, "geometric"),
    ({"depth": 2, "heads": [2], "scaling": "geometric", "ratio": [0.0]}, None, "positive"),
    ({"depth": 2, "heads": [2], "scaling": "linear", "head_dim": [4, 8]}, None, "one width"),
    ({"depth": 2, "heads": [2], "scaling": "cubic"}, None, "scaling"),
])
def test_a_scaled_space_that_allows_nothing_is_one_line(space, budget, says):
    message = one_line_error(search, GPT, space, budget)
    for word in (says,) if isinstance(says, str) else says:
        assert word in message


# ---- through the search file and the command line -------------------------------------------

def test_a_search_file_with_a_scaling_loads_and_dry_runs(tmp_path, capsys):
    raw = {"name": "scaled", "trials": 3, "base": WIDE, "confirm": {"enabled": False},
           "space": {"depth": [2, 4], "heads": "divisors", "scaling": "linear"},
           "budget": {"metric": "total_heads", "max": 60}}
    path = tmp_path / "scaled.toml"
    path.write_text(tomli_w.dumps(raw))
    s = load_search(str(path))
    assert isinstance(s.space, ScaledSpace) and s.space.scaling == "linear"
    assert s.space.size() == 3 * 14 * 14  # 3 depths, first and last from the 14 divisors of 192
    count = s.space.count()
    assert 0 < count < s.space.size() and all(sum(p.heads) <= 60 for p in s.space.plans())
    assert main(["search", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"space: depth 2..4; {3 * 14 * 14} plans before the budget; linear scaling of first.heads, last.heads" in out
    assert f"budget: total_heads <= 60; plans that meet it: {count} (depths 2, 3, 4)" in out
    assert not list(tmp_path.iterdir())[1:]  # a dry run writes nothing
