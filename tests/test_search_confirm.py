"""The confirmation: after the trials, the top plans and the named ones run as a verdict study on
fresh paired seeds, with the claim "the search's best beats the baseline" declared in it."""

from __future__ import annotations

import copy

import pytest

from headwise.cli import main
from headwise.config import read_toml
from headwise.search.confirm import confirm_study, top_plans
from headwise.search.definition import resolve_search
from headwise.search.trials import read_record
from headwise.study.layout import load_study_record
from helpers import read_csv
from test_search_driver import BASE, NAMED

LR = {"values": {"optim.lr": [0.005, 0.01, 0.02]}, "selection": {"task.eval_seed": 7}}
RAW = {"name": "mini", "seed": 2, "trials": 6, "base": BASE, "space": {"depth": [1, 2], "heads": [1, 2, 4]},
       "budget": {"metric": "total_heads", "max": 4}, "named": NAMED,
       "confirm": {"top_k": 2, "seeds": 3, "steps": 40, "baseline": "two-one", "nuisance": LR,
                   "report": {"kind": "depth", "baseline": "two-one"}}}


def _trial(number: int, heads: list[int], loss: float, search, state: str = "complete") -> dict:
    plan = next(p for p in search.space.plans() if p.heads == tuple(heads))
    return {"number": number, "state": state, "params": search.space.encode(plan), "values": {"loss": loss}}


def test_the_confirmation_is_a_study_of_the_best_and_the_named_plans_on_fresh_seeds():
    search = resolve_search(copy.deepcopy(RAW), "test")
    record = {"trials": [_trial(0, [1, 2], 0.9, search), _trial(1, [2, 1], 0.8, search), _trial(2, [4], 0.5, search),
                         _trial(3, [4], 0.5, search, "duplicate"), _trial(4, [2, 2], 0.4, search, "pruned"),
                         _trial(5, [1, 1], 0.7, search)]}
    top = top_plans(search, record)
    assert [(t.name, t.plan.heads) for t in top] == [("best-1", (4,)), ("best-2", (1, 1))]  # distinct, complete
    study = confirm_study(search, top)
    assert [v.name for v in study.variants] == ["best-1", "best-2", "one-two", "two-one"]
    assert study.variants[0].config["model"]["heads"] == [4] and study.variants[0].config["model"]["n_layers"] == 1
    assert study.seeds == 3 and study.config.base["train"]["steps"] == 40
    # its description says at what steps the trials chose and the confirmation trains
    steps = search.base["train"]["steps"]
    assert f"the best 2 plans of its trials (at {steps} steps)" in study.config.description
    assert "each trained 40 steps on fresh paired seeds" in study.config.description
    seeds = {run.config["train"]["seed"] for run in study.runs()}
    assert seeds == {0, 1, 2} and search.base["train"]["seed"] not in seeds  # fresh: the trials trained on 100
    assert not seeds & set(study.config.nuisance.seeds)
    (claim,) = study.config.claims
    assert claim.name == "the search's best beats two-one" and claim.pairs == [("best-1", "two-one")]
    assert claim.test == "better" and claim.metric == "loss"
    # a top plan that is a named one keeps its name, and is not run twice
    named_best = top_plans(search, {"trials": [_trial(0, [2, 1], 0.1, search), _trial(1, [4], 0.5, search)]})
    assert [t.name for t in named_best] == ["two-one", "best-1"]
    assert [v.name for v in confirm_study(search, named_best).variants] == ["two-one", "best-1", "one-two"]
    assert confirm_study(search, named_best).config.claims[0].pairs == [("best-1", "two-one")]


@pytest.mark.slow
def test_a_search_ends_with_its_confirmation_and_its_verdict(tmp_path):
    raw = copy.deepcopy(RAW)
    # the two named plans alone: the better one is the best, compared with the other on 2 seeds
    raw.update(trials=2, confirm={"top_k": 1, "seeds": 2, "steps": 20, "baseline": "two-one",
                                  "report": {"kind": "depth", "baseline": "two-one"}})
    src = tmp_path / "s.toml"
    import tomli_w

    src.write_text(tomli_w.dumps(raw))
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out), "--jobs", "2"]) == 0
    record = load_study_record(out / "confirm")
    assert record.name == "mini-confirm" and record.seeds == 2
    claims = read_toml(out / "confirm" / "study.toml")["definition"].get("claims", [])
    best = min(read_record(out)["trials"], key=lambda t: t["values"]["loss"])["named"]
    if best == "two-one":  # the baseline won the search: no claim of the search's best over it
        assert claims == []
    else:
        assert claims[0]["name"] == "the search's best beats two-one" and claims[0]["pairs"] == [["one-two", "two-one"]]
    rows = read_csv(out / "confirm" / "results.csv")
    assert len(rows) == 2 * len(record.variants) and {r["status"] for r in rows} == {"completed"}
    report = (out / "confirm" / "report" / "report.md").read_text()
    # per-layer plans are shown layer by layer, not by their first layer
    assert "| `one-two` | 2 layers, heads 1,2, head_dim " in report and "2 layers x 1 heads" not in report
    # --no-confirm on a rerun leaves it; a rerun finds nothing to do
    assert main(["search", str(src), "--out", str(out), "--no-confirm"]) == 0
