"""Bad input to ``headwise search`` is one line on stderr, exit status 2, and nothing written: a
space that allows nothing or contradicts itself, a budget no plan meets (or one a plan cannot
determine, tokens/s), an objective the task does not report, a storage URL that does not open,
a search folder whose search file changed since, and the rest below. Each case runs in-process
(:func:`bad_input_harness.run_case`) from a good search file with one mistake."""

from __future__ import annotations

import copy
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tomli_w
import torch

from bad_input_harness import c, run_case
from headwise.cli import main
from headwise.search.definition import load_search_file, resolve_search
from headwise.search.layout import save_search
from test_search_driver import BASE, NAMED

GOOD = {"name": "mini", "seed": 2, "trials": 4, "base": BASE, "space": {"depth": [1, 2], "heads": [1, 2, 4]},
        "budget": {"metric": "total_heads", "max": 4}, "named": NAMED, "confirm": {"enabled": False}}
CONFIRMED = {**GOOD, "named": NAMED + [{"name": "four", "heads": [4]}],
             "confirm": {"seeds": 2, "baseline": "four", "report": {"kind": "rank"}}}


def variant(data: dict, **over) -> dict:
    out = copy.deepcopy(data)
    for key, value in over.items():
        *path, last = key.split("__")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


#: a case that needs a machine without a GPU (with one, its search would run)
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")

FILES = {
    "good": GOOD,
    "confirmed": CONFIRMED,
    "empty-space": variant(GOOD, space={"depth": 2, "heads": [3, 5], "head_dim": "tied"}),
    "backwards-depth": variant(GOOD, space={"depth": [3, 1], "heads": [1]}),
    "empty-heads": variant(GOOD, space={"depth": 2, "heads": []}),
    "unmet-budget": variant(GOOD, budget={"metric": "total_heads", "target": 50}),
    "tokens-per-s": variant(GOOD, budget={"metric": "tokens_per_s", "min": 1000}),
    "target-and-cap": variant(GOOD, budget={"metric": "params", "target": 1000, "max": 2000}),
    "unknown-objective": variant(GOOD, objectives=[{"metric": "bleu", "direction": "maximize"}]),
    "only-budget-objective": variant(GOOD, objectives=[{"metric": "params"}]),
    "pruned-pareto": variant(GOOD, objectives=[{"metric": "loss"}, {"metric": "params"}],
                             fidelity={"pruner": "hyperband"}),
    "pruned-blind": variant(GOOD, fidelity={"pruner": "successive_halving"}, base={**BASE, "eval": {"every": 0}}),
    "too-few-trials": variant(GOOD, trials=1),
    "late-rung": variant(GOOD, fidelity={"pruner": "successive_halving", "min_steps": 25}),
    "base-plan": variant(GOOD, base={**BASE, "model": {**BASE["model"], "plan": {"scheme": "constant",
                                                                                 "total_heads": 2}}}),
    "unnamed-baseline": variant(CONFIRMED, confirm={"seeds": 2, "baseline": "nobody"}),
    "reused-seed": variant(CONFIRMED, confirm={"seeds": 2, "baseline": "four"}, fidelity={"run_seed": 1}),
}
ROOT_FILES = {f"{name}.toml": data for name, data in FILES.items()}


CASES = [
    c("empty space", "search", "empty-space.toml", says=("allows no layer", "divide")),
    c("space that contradicts itself", "search", "backwards-depth.toml", says="min <= max"),
    c("space with an empty list", "search", "empty-heads.toml", says="empty list"),
    c("budget no plan meets", "search", "unmet-budget.toml", says=("no plan of the space meets", "total_heads = 50")),
    c("tokens/s budget", "search", "tokens-per-s.toml", says=("measured by training", "params")),
    c("target and a cap", "search", "target-and-cap.toml", says="not both"),
    c("objective the task does not report", "search", "unknown-objective.toml", says=("bleu", "pick_accuracy")),
    c("only computed objectives", "search", "only-budget-objective.toml", says="nothing to train"),
    c("pruner with two objectives", "search", "pruned-pareto.toml", says="pruner"),
    c("pruner without an eval curve", "search", "pruned-blind.toml", says="eval] every"),
    c("fewer trials than named plans", "search", "too-few-trials.toml", "--out", "out", says="named plans"),
    c("fewer trials than named plans, dry run", "search", "too-few-trials.toml", "--dry-run", says="named plans"),
    c("pruner whose first rung is past the last evaluation", "search", "late-rung.toml", "--out", "out",
      says=("first rung at step 25", "train 30 steps", "min_steps of at most 20")),
    c("pruner whose first rung is past the last evaluation, dry run", "search", "late-rung.toml", "--dry-run",
      says="first rung at step 25"),
    c("worker with no search to join", "search", "good.toml", "--out", "nobody-here", "--worker",
      says="no search to join"),
    c("worker that would start afresh", "search", "saved-same.toml", "--out", "saved", "--worker", "--new",
      says=("--worker", "--new")),
    c("damaged optuna.db of the folder", "search", "saved-same.toml", "--out", "broken-store",
      says="broken-store/optuna.db is damaged"),
    c("base with a plan", "search", "base-plan.toml", says="[model.plan]"),
    c("baseline that is no named plan", "search", "unnamed-baseline.toml", says=("baseline 'nobody'", "four")),
    c("confirmation seeds that are the trials'", "search", "reused-seed.toml", says="fresh"),
    c("storage that does not open", "search", "good.toml", "--out", "out", "--storage",
      "sqlite:////nonexistent-headwise-dir/x/optuna.db", says=("does not open", "sqlite")),
    c("storage of an unknown kind", "search", "good.toml", "--out", "out", "--storage", "nosuchdb://nowhere",
      says="does not open"),
    c("storage that opens, device that is not there", "search", "good.toml", "--out", "out", "--storage",
      "sqlite:///fresh.db", "--set", "train.device=cuda", says="no CUDA device", marks=(NO_GPU,)),
    c("storage holding another search", "search", "good.toml", "--out", "fresh", "--storage", "sqlite:///other.db",
      says=("holds another search", "other")),
    c("unknown search", "search", "progresion", says="did you mean 'progression'"),
    c("out is a file", "search", "good.toml", "--out", "good.toml", says="is a file"),
    c("no search named", "search", says="--list"),
    c("changed search on resume", "search", "good.toml", "--out", "saved", says=("defined differently", "space",
                                                                                 "--new")),
    c("another store on resume", "search", "saved-same.toml", "--out", "saved", "--storage",
      "sqlite:///elsewhere.db", says="keeps its trials"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-search")
    for name, data in ROOT_FILES.items():
        (root / name).write_text(tomli_w.dumps(data))
    # a search folder as a first run leaves it (its search.toml), then the file changed after it
    first = variant(GOOD, space={"depth": [1, 3], "heads": [1, 2, 4]})
    (root / "saved-same.toml").write_text(tomli_w.dumps(first))
    raw, source = load_search_file(str(root / "saved-same.toml"))
    (root / "saved").mkdir()
    save_search(resolve_search(raw, source), root / "saved", {"threads": 1, "torch": version("torch")}, "", "headwise-search")
    # the same search, its own store damaged
    shutil.copytree(root / "saved", root / "broken-store")
    (root / "broken-store" / "optuna.db").write_bytes(b"not a database " * 100)
    # a store whose study of the search's name holds another search
    from headwise.search.store import open_storage, open_study

    raw, source = load_search_file(str(root / "good.toml"))
    other = resolve_search({**raw, "name": "other", "seed": 3}, source)
    open_study(other, open_storage(f"sqlite:///{root / 'other.db'}"))
    return root


def test_the_good_searches_dry_run(root, monkeypatch, capsys):
    monkeypatch.chdir(root)
    for name in ("good", "confirmed", "saved-same"):
        assert main(["search", f"{name}.toml", "--dry-run"]) == 0
    assert "plans that meet it: 7" in capsys.readouterr().out


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id, marks=k.marks) for k in CASES])
def test_bad_search_input_is_one_line_and_writes_nothing(case, root, monkeypatch, capsys):
    run_case(case, root, monkeypatch, capsys)


@pytest.mark.parametrize(("url", "driver"), [("postgresql://headwise@127.0.0.1:1/db", "psycopg"),
                                           ("postgresql+psycopg2://headwise@127.0.0.1:1/db", "psycopg2")])
def test_a_postgresql_store_without_its_driver_names_the_driver_and_the_extra(url, driver, root, monkeypatch, capsys):
    """Optuna's own message would suggest an SQLite URL instead."""
    for module in ("psycopg", "psycopg2"):
        monkeypatch.setitem(sys.modules, module, None)  # `import psycopg` fails, as where it is not installed
    run_case(c("postgresql without its driver", "search", "good.toml", "--out", "out", "--storage", url,
               says=(f"database driver '{driver}'", "pip install -e '.[postgres]'", "postgresql://")),
             root, monkeypatch, capsys)


def test_a_damaged_default_store_is_not_blamed_on_a_storage_flag(root, monkeypatch, capsys):
    monkeypatch.chdir(root)
    assert main(["search", "saved-same.toml", "--out", "broken-store"]) == 2
    assert "--storage" not in capsys.readouterr().err


def test_a_folder_another_driver_is_starting_in_is_no_foreign_folder(root, tmp_path):
    """Two drivers started together: the second may look while the first holds its locks and is
    writing search.toml (its temp file); that folder holds nothing else, so it is no refusal."""
    from headwise.search.layout import check_search_dir

    raw, source = load_search_file(str(root / "good.toml"))
    search = resolve_search(raw, source)
    starting = tmp_path / "starting"
    starting.mkdir()
    for name in (".lock", ".init.lock", ".search.toml.k2j4x8.tmp"):
        (starting / name).write_text("")
    assert check_search_dir(search, starting, new=False) == {}
    (starting / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="holds no search"):
        check_search_dir(search, starting, new=False)
