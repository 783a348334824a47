"""``[fidelity] set``: run-config keys of the search's trials only. A trial's run config has them,
the confirmation's study none of them; a key no run config has (or one the fidelity or the space
sets) is refused in one line before anything is written; the search's fingerprint holds them,
and a search without them keeps the fingerprint it had; the built-in searches' trials select on
a hold-out of the training data while their confirmations compare on the evaluation data.
Nothing here trains."""

from __future__ import annotations

import copy
from importlib.metadata import version
from pathlib import Path

import pytest
import tomli_w

from bad_input_harness import c, run_case
from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.search import load_search
from headwise.search.confirm import Top, confirm_raw, confirm_study
from headwise.search.definition import resolve_search
from headwise.search.layout import SEARCH_TOML, check_search_dir, save_search
from headwise.train.config import RunConfig
from test_search_confirm import RAW  # the nearest-neighbour search; its tuning selects on task.eval_seed = 7

#: the trials' own evaluation draw (the confirmation's runs keep the base's)
SET = {"task.eval_seed": 9}
#: RAW's fingerprint as the code before [fidelity] set computed it
OLD_FINGERPRINT = "34c653cca69d05a3"


def with_set(raw: dict, sets: dict) -> dict:
    out = copy.deepcopy(raw)
    out.setdefault("fidelity", {})["set"] = sets
    return out


def _example(search):
    return [Top("best-1", next(search.space.plans(limit=1)))]


# --------------------------------------------------------------------------- trials, not the confirmation

def test_a_trial_runs_with_the_set_and_the_confirmation_without_it(tmp_path):
    raw = with_set(RAW, SET)
    raw["base"] = {**raw["base"], "task": {**raw["base"]["task"], "eval_seed": 3}}  # the base's own value
    search = resolve_search(raw, "test")
    plan = next(search.space.plans(limit=1))
    trial = search.trial_config(plan)
    assert trial["task"]["eval_seed"] == 9 and RunConfig.parse(trial).task.eval_seed == 9
    assert trial["train"]["seed"] == 100  # the fidelity's seed, as before
    # the confirmation starts from the base as the file gives it: 3, not the trials' 9
    top = _example(search)
    raw_study = confirm_raw(search, top)
    assert raw_study["base"]["task"]["eval_seed"] == 3
    study = confirm_study(search, top)
    assert {run.config["task"]["eval_seed"] for run in study.runs()} == {3}
    assert study.config.nuisance.selection == {"task.eval_seed": 7}  # its tuning selects on its own split
    # its claim says what the trials were chosen with
    assert raw_study["claims"][0]["source"].endswith("on seed 100 (with task.eval_seed = 9), declared before these runs")
    # the search folder's search.toml keeps the set, and the trials' run config is what trains
    save_search(search, tmp_path, {"threads": 1, "torch": version("torch")}, "", "headwise-search")
    saved = read_toml(tmp_path / SEARCH_TOML)
    assert saved["definition"]["fidelity"]["set"] == SET and saved["fingerprint"] == search.fingerprint()


def test_a_key_absent_from_the_base_is_absent_from_the_confirmation():
    search = resolve_search(with_set(RAW, SET), "test")
    assert "eval_seed" not in confirm_raw(search, _example(search))["base"]["task"]
    assert "eval_seed" not in search.confirm_base["task"] and search.base["task"]["eval_seed"] == 9


def test_without_a_set_the_confirmation_and_the_trials_are_as_before():
    search = resolve_search(copy.deepcopy(RAW), "test")
    assert search.base == search.confirm_base and search.config.fidelity.set is None
    source = confirm_raw(search, _example(search))["claims"][0]["source"]
    assert source.endswith("on seed 100, declared before these runs")


# --------------------------------------------------------------------------- refused in one line

BAD = {
    "misspelt": {"task.eval_sed": 9},
    "model-key": {"model.d_model": 32},
    "steps-key": {"train.steps": 10},
    "seed-key": {"train.seed": 5},
    "value-as-table": {"optim.lr.x": 1},
}
CASES = [
    c("misspelt key", "search", "misspelt.toml", "--out", "out", says=("[fidelity] set", "unknown key", "eval_seed")),
    c("model key", "search", "model-key.toml", "--out", "out", says=("fidelity.set", "model.d_model", "[base]")),
    c("the fidelity's steps", "search", "steps-key.toml", "--out", "out", says=("train.steps", "[fidelity] steps")),
    c("the fidelity's seed", "search", "seed-key.toml", "--out", "out", says=("train.seed", "run_seed")),
    c("a value as a table", "search", "value-as-table.toml", "--out", "out", says=("[fidelity] set", "not a section")),
    c("misspelt key, dry run", "search", "misspelt.toml", "--dry-run", says="unknown key"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-fidelity-set")
    for name, sets in BAD.items():
        (root / f"{name}.toml").write_text(tomli_w.dumps(with_set(RAW, sets)))
    return root


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in CASES])
def test_a_bad_set_is_one_line_and_writes_nothing(case, root, monkeypatch, capsys):
    run_case(case, root, monkeypatch, capsys, leftovers=("out",))


# --------------------------------------------------------------------------- the fingerprint

def test_the_fingerprint_holds_the_set_and_is_unchanged_without_one():
    plain = resolve_search(copy.deepcopy(RAW), "test")
    assert plain.fingerprint() == OLD_FINGERPRINT and "set" not in plain.identity()["definition"]["fidelity"]
    assert resolve_search(with_set(RAW, {}), "test").fingerprint() == OLD_FINGERPRINT  # an empty set is none
    with_it = resolve_search(with_set(RAW, SET), "test").fingerprint()
    assert with_it != OLD_FINGERPRINT
    # a nested table says the same as a dotted key; another value is another search
    assert resolve_search(with_set(RAW, {"task": {"eval_seed": 9}}), "test").fingerprint() == with_it
    assert resolve_search(with_set(RAW, {"task.eval_seed": 8}), "test").fingerprint() not in (with_it, OLD_FINGERPRINT)


def test_a_search_resumed_with_a_set_it_did_not_have_is_refused(tmp_path):
    plain = resolve_search(copy.deepcopy(RAW), "test")
    save_search(plain, tmp_path, {"threads": 1, "torch": version("torch")}, "", "headwise-search")
    assert check_search_dir(resolve_search(with_set(RAW, {}), "test"), tmp_path, new=False)  # the same search
    with pytest.raises(HeadwiseError, match=r"defined differently \(changed: fidelity\)"):
        check_search_dir(resolve_search(with_set(RAW, SET), "test"), tmp_path, new=False)


# --------------------------------------------------------------------------- the built-in searches

#: the LM searches' trials select on one half of a 10% hold-out of the training stories; the
#: verdict's confirmation compares on the other half (the training text's format), tiny's on the file
LM = ("validation", "fraction:0.1:2/2", {"tiny": "tinystories-valid-sample.txt", "verdict": "fraction:0.1:1/2"})
#: search -> (the task key the trials set, their hold-out, what the confirmation compares on by preset)
BUILTIN = {
    "depth-for-heads": LM,
    "kv-heads": LM,
    "progression": LM,
    "vit-depth-for-heads": ("holdout", 5000, {"tiny": None, "verdict": None}),  # None: the test split (holdout 0)
}


@pytest.mark.parametrize("preset", ["tiny", "verdict"])
@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_the_builtin_trials_select_on_held_out_training_data_and_confirm_on_the_evaluation_data(name, preset):
    key, held, by_preset = BUILTIN[name]
    compared = by_preset[preset]
    search = load_search(name, preset=preset)
    assert search.config.fidelity.set == {f"task.{key}": held} and search.config.confirm.enabled
    assert search.trial_config(next(search.space.plans(limit=1)))["task"][key] == held
    top = _example(search)
    assert confirm_raw(search, top)["base"]["task"].get(key) == compared
    study = confirm_study(search, top)
    assert {run.config["task"].get(key) for run in study.runs()} == {compared}
    if study.config.nuisance is not None:  # the verdict's tuning selects on the trials' hold-out
        assert study.config.nuisance.selection == {f"task.{key}": held}


def test_the_quick_presets_keep_the_lm_hold_out_and_the_vision_test_split():
    for name in ("depth-for-heads", "kv-heads", "progression"):
        assert load_search(name, preset="quick").base["task"]["validation"] == "fraction:0.1:2/2"
    quick = load_search("vit-depth-for-heads", preset="quick")
    assert quick.base["task"]["holdout"] == 0 and not quick.config.confirm.enabled



def test_a_dry_run_names_the_trials_only_keys(capsys):
    from headwise.cli import main

    assert main(["search", "kv-heads", "--preset", "verdict", "--dry-run"]) == 0
    assert "trials only (not the confirmation): task.validation = 'fraction:0.1:2/2'" in capsys.readouterr().out
