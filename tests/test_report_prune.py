"""The prune layout's rows of a search's best plans (issue 45: where pruning put the heads, beside
where a search put them), read from a hand-written ``trials.json``."""

from __future__ import annotations

import json

import pytest

from headwise.errors import HeadwiseError
from headwise.families.lm.report_prune import PruneOptions, search_folder, search_rows
from headwise.search.record import load_search_record


def _trial(number, state, heads, loss):
    return {"number": number, "state": state, "heads": heads, "values": {} if loss is None else {"loss": loss}}


@pytest.fixture
def search_dir(tmp_path):
    folder = tmp_path / "search"
    folder.mkdir()
    trials = [_trial(0, "complete", [24, 24, 24, 24], 5.20),
              _trial(1, "complete", [8, 16, 32, 40], 5.05),
              _trial(2, "pruned", [40, 32, 16, 8], 4.90),     # pruned: its value is an early one, not ranked
              _trial(3, "complete", [8, 16, 32, 40], 5.01),   # the same plan again: shown once, at its best
              _trial(4, "fail", [4, 4, 44, 44], None),
              _trial(5, "complete", [32, 32, 16, 16], 5.10)]
    (folder / "trials.json").write_text(json.dumps(
        {"search": "progression", "objectives": [{"metric": "loss", "direction": "minimize"}], "trials": trials}))
    return folder


def test_the_best_distinct_complete_plans_by_the_first_objective(search_dir):
    rows = search_rows(load_search_record(search_dir), top=3)
    assert [r["heads"] for r in rows] == ["8 16 32 40", "32 32 16 16", "24 24 24 24"]
    assert [r["total_heads"] for r in rows] == [96, 96, 96]
    assert rows[0]["model"] == "search progression #1 (trial 3, loss 5.0100 at the search's fidelity)"
    assert all(r["loss"] is None for r in rows)  # a trial's value is not a run's final loss
    assert len(search_rows(load_search_record(search_dir), top=1)) == 1


def test_a_maximised_objective_ranks_the_largest_first(search_dir):
    path = search_dir / "trials.json"
    data = json.loads(path.read_text())
    data["objectives"] = [{"metric": "loss", "direction": "maximize"}]
    path.write_text(json.dumps(data))
    assert search_rows(load_search_record(search_dir), top=1)[0]["heads"] == "24 24 24 24"


def test_the_folder_is_under_the_study_unless_absolute(tmp_path):
    assert search_folder(tmp_path / "study", "../s") == tmp_path / "study" / "../s"
    assert search_folder(tmp_path / "study", str(tmp_path / "s")) == tmp_path / "s"


def test_a_folder_that_holds_no_search_is_one_line(tmp_path):
    with pytest.raises(HeadwiseError, match="is not a search folder"):
        load_search_record(tmp_path)


def test_the_options_refuse_a_top_of_zero():
    with pytest.raises(ValueError):
        PruneOptions(search="s", search_top=0)
