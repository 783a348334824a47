"""The prune layout's rows of a search's best plans (issue 45: where pruning put the heads, beside
where a search put them), read from a hand-written ``trials.json``; and the whole report of a
hand-written prune study with and without that search."""

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


def _written_study(out, search: str | None):
    """The built-in prune study's quick preset, one seed, its runs hand-written: the baseline and
    the from-scratch plans completed, each stage's run with the heads its ``pruned.json`` kept;
    the report's ``search`` option set to ``search``."""
    from headwise.plans import Plan
    from headwise.run import RunStatus, RunSummary
    from headwise.study.definition import load_study_file, resolve_study
    from headwise.study.layout import run_dir, save_study
    from headwise.study.stages import stage_root
    from helpers import write_run_dir

    raw, _ = load_study_file("prune")
    raw["presets"]["quick"].setdefault("report", {}).update({"kind": "prune", "search": search}
                                                           if search else {"kind": "prune"})
    study = resolve_study(raw, "prune.toml", preset="quick", seeds=1)
    save_study(study, out, 1)

    def completed(path, config, heads, loss):
        summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=1000,
                             plan=Plan.explicit(heads, [96 // h for h in heads]), steps=100, tokens=1600,
                             tokens_per_step=16)
        write_run_dir(path, config, summary, [{"step": 100, "eval_loss": loss}], 0)

    for v in study.variants:
        completed(run_dir(out, v.name, 0), v.config, list(v.plan.heads), {"baseline": 3.0}.get(v.name, 3.5))
    for stage, heads, loss in (("prune-global", [16, 12, 12, 8], 3.25), ("prune-uniform", [12, 12, 12, 12], 3.3)):
        path = run_dir(stage_root(out, stage), "baseline", 0)
        completed(path, {}, heads, loss)
        (path / "pruned.json").write_text(json.dumps({"after": {"heads": heads}}))


def _report_rows(out):
    """``headwise report`` on the study: its heads-per-layer section and CSV rows."""
    from headwise.cli import main
    from helpers import read_csv

    assert main(["report", str(out)]) == 0
    text = (out / "report" / "report.md").read_text()
    section = text.split("## Where pruning put the heads", 1)[1].split("\n## ", 1)[0]
    return section, read_csv(out / "report" / "heads_per_layer.csv")


def test_the_whole_report_puts_the_search_s_plans_beside_pruning_s_and_the_blog_s(search_dir, tmp_path):
    out = tmp_path / "study"
    _written_study(out, "../search")  # the search folder beside the study's, relative to it
    section, rows = _report_rows(out)
    assert "and the best plans of the search in `../search`" in section
    by_model = {r["model"]: r for r in rows}
    assert by_model["prune-global (baseline)"]["heads"] == "16 12 12 8"
    assert float(by_model["prune-global (baseline)"]["loss"]) == 3.25
    assert by_model["prune-uniform (baseline)"]["heads"] == "12 12 12 12"
    # the search's three best distinct plans, in order, after pruning's rows
    searched = [r["heads"] for r in rows if r["model"].startswith("search progression #")]
    assert searched == ["8 16 32 40", "32 32 16 16", "24 24 24 24"]
    assert "| search progression #1 (trial 3, loss 5.0100 at the search's fidelity) | – | 8 16 32 40 | 96 |" in section


def test_a_search_folder_not_there_is_said_in_the_report_which_still_shows_the_runs(tmp_path):
    out = tmp_path / "study"
    _written_study(out, "../no-search-here")
    section, rows = _report_rows(out)
    assert "(no search's plans: " in section and "no-search-here" in section
    assert not any(r["model"].startswith("search ") for r in rows)
    assert {r["model"] for r in rows} >= {"baseline", "prune-global (baseline)", "prune-uniform (baseline)"}
