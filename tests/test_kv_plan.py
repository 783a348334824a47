"""Key/value-head plans over a query-head plan (headwise.plans.plan_kv_heads): a group size in
every layer, or a scheme with a budget of KV heads; checked against hand-worked plans, through
``[model.plan]`` into the run's spec, and through ``headwise plan``."""

import json

import pytest

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.params import kv_cache_bytes_per_token
from headwise.plans import plan_kv_heads
from headwise.train.config import resolve_run_model


def test_a_group_size_divides_every_layer():
    assert plan_kv_heads([12, 24, 48, 96], group=4) == ((3, 6, 12, 24), ())
    assert plan_kv_heads([8, 8], group=1) == ((8, 8), ())  # multi-head attention
    with pytest.raises(HeadwiseError, match=r"layer 3: 3 query heads are not a multiple of kv_group 2.*\(1, 3\)"):
        plan_kv_heads([24, 12, 6, 3], group=2)


@pytest.mark.parametrize("heads, scheme, total, expected", [
    ([96, 48, 24, 12], "constant", 16, (4, 4, 4, 4)),
    ([12, 24, 48, 96], "ascending", 15, (1, 2, 4, 8)),
    ([4, 4, 4, 4], "constant", 8, (2, 2, 2, 2)),
])
def test_a_scheme_spreads_a_budget_of_kv_heads(heads, scheme, total, expected):
    assert plan_kv_heads(heads, scheme=scheme, total=total) == (expected, ())


def test_a_scheme_s_layers_snap_to_divisors_of_their_own_query_heads():
    # descending 8,4,2,1 over query heads 12,24,48,96: 8 does not divide 12, and its nearest divisor
    # is 6; no scaling of the shape totals exactly 15, the nearest (13) does, and the plan says so
    kv, notes = plan_kv_heads([12, 24, 48, 96], scheme="descending", total=15)
    assert kv == (6, 4, 2, 1) and "totals exactly 15; nearest is 13" in notes[0]


def test_a_budget_no_plan_meets_exactly_takes_the_nearest_and_says_so():
    kv, notes = plan_kv_heads([3, 3, 3, 3], scheme="constant", total=6)  # 1 or 3 per layer: totals 4, 12, ...
    assert sum(kv) != 6 and notes and "totals exactly 6" in notes[0]
    with pytest.raises(HeadwiseError, match="between 4 .* and 12"):
        plan_kv_heads([3, 3, 3, 3], scheme="constant", total=13)


def test_the_run_config_s_plan_sets_the_spec_s_kv_heads():
    cfg = {"model": {"preset": "llama-tiny", "d_model": 192, "max_seq_len": 128,
                     "plan": {"scheme": "descending", "total_heads": 180, "kv_scheme": "constant", "kv_total_heads": 16}},
           "task": {"kind": "lm", "source": "tinystories-train-sample.txt", "tokenizer": "gpt-neo", "block_size": 64},
           "train": {"steps": 10}}
    spec, plan = resolve_run_model(cfg)
    assert spec.heads == [96, 48, 24, 12] and spec.kv_heads_per_layer == [4, 4, 4, 4]
    assert plan.kv_heads == (4, 4, 4, 4) and plan.to_dict()["kv_heads"] == [4, 4, 4, 4]
    # 2 (k and v) x 4 KV heads x head widths 2, 4, 8, 16 x 4 bytes
    assert kv_cache_bytes_per_token(spec) == 2 * 4 * (2 + 4 + 8 + 16) * 4
    cfg["model"]["plan"] = {"scheme": "layerwise", "kv_group": 2}
    with pytest.raises(HeadwiseError, match="sets the key/value heads itself"):
        resolve_run_model(cfg)
    cfg["model"]["plan"] = {"scheme": "constant", "total_heads": 16, "kv_group": 2, "kv_scheme": "constant"}
    with pytest.raises(HeadwiseError, match="not both"):
        resolve_run_model(cfg)


def test_headwise_plan_prints_the_kv_plan(capsys):
    assert main(["plan", "--d-model", "192", "--scheme", "ascending", "--total-heads", "180", "--kv-group", "4",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_heads"] == [3, 6, 12, 24] and out["kv_cache_bytes_per_token"]["fp32"] == 2 * 4 * (3 * 16 + 6 * 8 + 12 * 4 + 24 * 2)
    assert main(["plan", "--scheme", "constant", "--total-heads", "16", "--kv-scheme", "constant"]) == 2
    assert "go together" in capsys.readouterr().err
