"""Nuisance settings tuned per variant: the grid, its extension past an edge, and a study that
tunes its learning rate on a selection split before its seeds run."""

from __future__ import annotations

import json

import pytest
import tomli_w

from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.run import read_summary
from headwise.study import load_study
from headwise.study.nuisance import Nuisance, beyond, choose, grid, label

from helpers import read_csv, tiny_nearest_config

LR = "optim.lr"


def nuisance(values=(0.001, 0.01, 0.1), extend=2) -> Nuisance:
    return Nuisance.parse({"values": {LR: list(values)}, "selection": {"task.eval_seed": 99}, "extend": extend})


def point(lr: float):
    return ((LR, lr),)


def test_a_best_value_inside_the_grid_is_the_choice():
    n = nuisance()
    axes = {LR: [0.001, 0.01, 0.1]}
    values = {point(0.001): 2.0, point(0.01): 1.5, point(0.1): 1.9}
    choice, todo = choose("v", axes, set(values), values, n, {})
    assert todo == [] and choice.best == {LR: 0.01} and choice.at_edge == []
    assert choice.tried["lr0.01"] == ({LR: 0.01}, 1.5)


def test_an_edge_grows_the_axis_geometrically_until_extensions_run_out():
    n, axes, ext = nuisance(extend=1), {LR: [0.001, 0.01, 0.1]}, {}
    values = {point(0.001): 2.0, point(0.01): 1.5, point(0.1): 1.2}
    choice, todo = choose("v", axes, set(values), values, n, ext)
    assert choice.best is None and todo == [point(1.0)]                  # 0.1 * 0.1 / 0.01, rounded
    assert axes[LR][-1] == 1.0 and ext == {LR: 1}
    values[todo[0]] = 1.1                                                # still better: at the edge again
    choice, todo = choose("v", axes, set(values), values, n, ext)
    assert todo == [] and choice.best == {LR: 1.0} and choice.at_edge == [LR]


def test_unfinished_points_come_first_and_a_diverged_run_is_finished_without_a_value():
    n, axes = nuisance(), {LR: [0.001, 0.01, 0.1]}
    choice, todo = choose("v", axes, {point(0.001)}, {point(0.001): 2.0}, n, {})
    assert choice.best is None and todo == [point(0.01), point(0.1)]
    done = {point(0.001), point(0.01), point(0.1)}                       # 0.1 diverged: no value
    choice, todo = choose("v", axes, done, {point(0.001): 2.0, point(0.01): 1.8}, n, {})
    assert choice.best == {LR: 0.01} and todo == []


def test_beyond_a_non_positive_edge_takes_the_same_step():
    assert beyond([0.0, 0.05, 0.1], low_edge=False) == pytest.approx(0.15)
    assert beyond([0.0, 0.05, 0.1], low_edge=True) == pytest.approx(-0.05)
    assert beyond([1e-3, 1e-2, 1e-1], low_edge=True) == pytest.approx(1e-4)


def test_grid_and_labels():
    assert grid({"optim.lr": [1.0, 2.0], "optim.weight_decay": [0.0, 0.1]})[1] == (("optim.lr", 1.0),
                                                                                    ("optim.weight_decay", 0.1))
    assert label((("optim.lr", 0.003), ("schedule.warmup_frac", 0.05))) == "lr0.003-warmup_frac0.05"


@pytest.mark.parametrize("table, message", [
    ({"values": {LR: [0.1, 0.2]}, "selection": {"task.eval_seed": 9}}, "at least three values"),
    ({"values": {LR: [0.1, 0.2, 0.1]}, "selection": {"task.eval_seed": 9}}, "values repeat"),
    ({"values": {LR: [0.1, 0.2, 0.3]}, "selection": {"task.eval_seed": 9}, "seeds": [1000]}, "at least 2 items"),
    ({"values": {LR: [0.1, 0.2, 0.3]}, "selection": {"task.eval_seed": 9}, "seeds": [7, 7]}, "distinct seeds"),
    ({"values": {LR: [0.1, 0.2, 0.3]}}, "selection"),
])
def test_a_bad_nuisance_table_is_one_line(table, message):
    with pytest.raises(HeadwiseError, match=message) as err:
        Nuisance.parse(table)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_study_tunes_each_variant_then_runs_its_seeds_at_the_choice(tmp_path):
    from headwise.study.runner import run_study
    from headwise.train.held_out import held_out_scores

    study_file = tmp_path / "tuned.toml"
    # one study seed: every seed's run takes the variant's choice alike (each run costs ~5 s of startup,
    # so the runs are few). Adam's step is about lr * g / eps once eps dwarfs g, so "two" (eps 100) wants
    # a far larger lr than "one": "one" chooses 1 inside the grid (selection loss 1.00 against 1.51 and
    # 2.28), "two" extends past 10 once, to 100, and is still at the edge (1.10 against 1.83).
    study_file.write_text(tomli_w.dumps({
        "name": "tuned", "seeds": 1, "base": tiny_nearest_config(6, 3, 3),
        "variants": [{"name": "one", "set": {"model.heads": [1]}},
                     {"name": "two", "set": {"model.heads": [2], "model.head_dim": 4, "optim.eps": 100.0}}],
        "nuisance": {"values": {LR: [0.1, 1.0, 10.0]}, "selection": {"task.eval_seed": 99}, "extend": 1},
    }))
    study = load_study(str(study_file))
    lines: list[str] = []
    out = tmp_path / "out"
    run_study(study, out, jobs=2, threads=1, echo=lines.append)
    choices = {c["variant"]: c for c in json.loads((out / "tuning" / "tuning.json").read_text())}
    assert set(choices) == {"one", "two"}
    assert choices["one"]["at_edge"] == [] and choices["two"]["at_edge"] == [LR]
    for name, c in choices.items():
        assert c["best"] is not None and c["seeds"] == [1000, 1001]
        tried = {v[0][LR]: v[1] for v in c["tried"].values()}
        assert sorted(tried) == ([0.1, 1.0, 10.0] if name == "one" else [0.1, 1.0, 10.0, 100.0])
        assert c["best"][LR] == min(tried, key=lambda lr: tried[lr])     # the lowest selection loss wins
        for label_, (p, mean) in c["tried"].items():                     # the mean over both tuning seeds
            per_seed = [read_summary(out / "tuning" / name / f"{label_}-seed{s}").final_eval_loss for s in (1000, 1001)]
            assert mean == pytest.approx(sum(per_seed) / 2, rel=1e-12) and per_seed[0] != per_seed[1]
        final = (out / "runs" / name / "seed0" / "config.toml").read_text()
        assert f"lr = {c['best'][LR]}" in final and "eval_seed = 1234" in final   # reported split
        tuning_cfgs = sorted((out / "tuning" / "configs").glob(f"{name}-lr*.toml"))
        assert all("eval_seed = 99" in f.read_text() for f in tuning_cfgs)  # the selection split
        # no tuning run shares a seed with the runs the report compares
        assert {read_toml(f)["train"]["seed"] for f in tuning_cfgs} == {1000, 1001}
        # each tuning run is also scored on the reported split (eval_seed 1234), never used to choose
        assert set(c["evaluated"]) == set(c["tried"])
        run = out / "tuning" / name / f"{next(iter(c['tried']))}-seed1000"
        # scoring a run again on its own split gives what its trainer measured
        assert held_out_scores(run, {"task.eval_seed": 99})["loss"] == pytest.approx(
            read_summary(run).final_eval_loss, rel=1e-6)
        assert held_out_scores(run, {"task.eval_seed": 1234})["loss"] != pytest.approx(
            read_summary(run).final_eval_loss, rel=1e-6)
    from headwise.report import write_report

    text = write_report(out, samples=False, conditioning=False, echo=lambda _: None).read_text()
    assert "## Tuning" in text and "selected on `task.eval_seed = 99`" in text
    assert "Tuning against the evaluation" in text and "| tuning chose | evaluation's best |" in text
    assert "tuning seeds 1000, 1001 (seeds the verdicts do not use)" in text
    figure = [r for r in read_csv(out / "report" / "tuning.csv") if r["chosen"] == "True"]
    assert {r["variant"]: float(r["value"]) for r in figure} == {k: c["best"][LR] for k, c in choices.items()}
    # a rerun finds everything done and chooses the same
    again: list[str] = []
    run_study(load_study(str(study_file)), out, jobs=2, threads=1, echo=again.append)
    assert not any(line.startswith("tuning") for line in again)
    assert {c["variant"]: c["best"] for c in json.loads((out / "tuning" / "tuning.json").read_text())} == \
        {k: c["best"] for k, c in choices.items()}


def test_tuning_seeds_that_a_verdict_would_compare_are_refused_in_one_line(tmp_path):
    study_file = tmp_path / "tuned.toml"
    study_file.write_text(tomli_w.dumps({
        "name": "tuned", "seeds": 3, "base": tiny_nearest_config(6, 3, 3),
        "variants": [{"name": "one", "set": {"model.heads": [1]}}],
        "nuisance": {"values": {LR: [0.001, 0.01, 0.1]}, "selection": {"task.eval_seed": 99}, "seeds": [2, 9]},
    }))
    with pytest.raises(HeadwiseError, match=r"tuning seed 2 would also be a seed the study reports \(0..2\)") as err:
        load_study(str(study_file))
    assert "\n" not in str(err.value)
    assert load_study(str(study_file), seeds=2).seeds == 2                # seeds 0, 1: apart from 2 and 9
    with pytest.raises(HeadwiseError, match="tuning seeds 2, 9 would also be seeds"):
        load_study(str(study_file), seeds=10)
