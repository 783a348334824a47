"""``[[stages]]``: runs that start from each run of a study (pretrain -> fine-tune), the built-in
``encoder`` study, and its Table 1 report with verdicts on a stage's runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.config import read_toml
from headwise.errors import HeadwiseError
from headwise.params import count_params
from headwise.study.definition import load_study_file, resolve_run_model, resolve_study
from headwise.study.stages import Stage, stage_config
from tests.conftest import shared_data_dir

GLUE_STAGE = {"name": "order", "source_keys": ["train.init_from", "task.tokenizer_from"],
              "config": {"task": {"kind": "glue", "task": "standin_order"}}}


def _study(**extra) -> dict:
    """A two-variant encoder study at a few steps: pretraining, then a word-order fine-tuning stage."""
    raw = {
        "name": "stages-test", "seeds": 2,
        "base": {"model": {"preset": "crammed-bert-tiny", "d_model": 32, "mlp_hidden": 64},
                 "task": {"kind": "mlm", "source": "tinystories-train-sample.txt",
                          "validation": "tinystories-valid-sample.txt", "tokenizer": "bpe:1024",
                          "eval_batches": 1, "eval_batch_size": 4},
                 "train": {"steps": 3, "micro_batch": 4, "log_every": 1, "device": "cpu"},
                 "eval": {"every": 0}, "checkpoint": {"every": 0}},
        "variants": [{"name": "l2-h2", "set": {"model.n_layers": 2, "model.heads": 2}},
                     {"name": "l1-h4", "set": {"model.n_layers": 1, "model.heads": 4}}],
        "report": {"kind": "encoder", "baseline": "l2-h2", "table": ["l2-h2", "l1-h4"]},
        "stage_defaults": {"model": {"dropout": 0.1}, "optim": {"lr": 1e-3},
                           "task": {"source": "tinystories-valid-sample.txt", "max_length": 24,
                                    "eval_batch_size": 64},
                           "train": {"steps": 3, "micro_batch": 4, "device": "cpu"},
                           "eval": {"every": 0}, "checkpoint": {"every": 0}},
        "stages": [GLUE_STAGE],
        "claims": [{"name": "1 x 4 as good as 2 x 2", "test": "as_good", "stage": "order", "metric": "accuracy",
                    "better": "higher", "percent": True, "margin": 50.0, "pairs": [["l1-h4", "l2-h2"]]}],
    }
    raw.update(extra)
    return raw


def test_a_stage_config_is_its_own_tables_over_the_variants_model():
    stage = Stage.parse({**GLUE_STAGE, "config": {"model": {"dropout": 0.1}, "task": {"kind": "glue"},
                                                  "train": {"steps": 7, "seed": 99}}})
    variant = {"model": {"preset": "crammed-bert-tiny", "n_layers": 2, "dropout": 0.0},
               "task": {"kind": "mlm"}, "train": {"steps": 500, "seed": 1}, "log": {"trackers": ["csv"]}}
    cfg = stage_config(stage, variant, "/s/runs/l2/seed1", 1)
    assert cfg["model"] == {"preset": "crammed-bert-tiny", "n_layers": 2, "dropout": 0.1}
    assert cfg["task"] == {"kind": "glue", "tokenizer_from": "/s/runs/l2/seed1"}
    # the run's seed, never the stage's own: seed s of every variant fine-tunes on the same batches
    assert cfg["train"] == {"steps": 7, "seed": 1, "init_from": "/s/runs/l2/seed1"}
    assert cfg["log"] == {"trackers": ["csv"]}  # inherited
    assert "optim" not in cfg  # not the pretraining run's: the stage gives its own or the defaults


def test_stage_defaults_merge_under_every_stage():
    study = resolve_study(_study(), "test")
    (stage,) = study.config.stages
    assert stage.config["task"] == {"kind": "glue", "task": "standin_order", "source": "tinystories-valid-sample.txt",
                                    "max_length": 24, "eval_batch_size": 64}
    assert stage.config["optim"] == {"lr": 1e-3}
    assert "stage_defaults" not in study.to_dict()["definition"]


@pytest.mark.parametrize(("change", "says"), [
    ({"stages": [GLUE_STAGE, GLUE_STAGE]}, "stage names repeat"),
    ({"claims": [{"name": "x", "stage": "sst2", "metric": "accuracy", "better": "higher", "pairs": [["l1-h4", "l2-h2"]]}]},
     "a claim compares stage 'sst2', which the study does not have (stages: order)"),
    ({"stages": [{**GLUE_STAGE, "source_keys": ["train.init_from"]}]}, "variant 'l2-h2': stage 'order'"),
    ({"stages": [{**GLUE_STAGE, "config": {"task": {"kind": "glue", "task": "wnli"}}}]}, "variant 'l2-h2'"),
    ({"stages": [{"name": "bad name!", "config": {}}]}, "stage name 'bad name!'"),
    ({"stage_defaults": 3}, "`stage_defaults` must be a table"),
    ({"stages": [{**GLUE_STAGE, "config": 5}]}, "stage 'order': `config` must be a table of run-config tables"),
    ({"stages": [{**GLUE_STAGE, "config": {"model": 5}}]}, "config.model"),
])
def test_bad_stages_are_refused_when_the_study_is_resolved(change, says):
    with pytest.raises(HeadwiseError) as err:
        resolve_study(_study(**change), "test")
    assert says in str(err.value)


@pytest.mark.parametrize("preset", ["paper", "tiny", "quick"])
def test_the_builtin_encoder_study_resolves(preset):
    raw, source = load_study_file("encoder")
    study = resolve_study(raw, source, preset)
    assert study.config.report["kind"] == "encoder" and study.config.stages
    for stage in study.config.stages:
        assert stage.source_keys == ["train.init_from", "task.tokenizer_from"]
        assert stage.config["task"]["kind"] == "glue"
    if preset == "paper":
        assert [s.name for s in study.config.stages] == ["mnli", "sst2", "stsb", "rte", "qnli", "qqp", "mrpc", "cola"]
        assert {v.name for v in study.variants} == {"l16-h12", "l16-h24", "l10-h12", "l10-h24"}
        # cramming's GLUE recipe in every stage
        assert all(s.config["optim"] == {"lr": 4e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.0}
                   for s in study.config.stages)
        # the paper's two models at cramming's counts (the paper: 119M and 84M), with a BPE of 32,768 ids
        counts = {v.name: count_params(resolve_run_model(v.config)[0]) for v in study.variants}
        assert counts["l16-h12"] == 119_589_889 and counts["l10-h24"] == 84_182_017


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The two-variant study run to the end (pretraining, then its stage) with its report."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
    mp.setenv("HEADWISE_CACHE", str(tmp_path_factory.mktemp("cache")))
    root = tmp_path_factory.mktemp("stages")
    path = root / "study.toml"
    path.write_text(tomli_w.dumps(_study()))
    out = root / "out"
    assert main(["study", str(path), "--out", str(out), "--jobs", "2"]) == 0
    yield path, out
    mp.undo()


@pytest.mark.slow
def test_every_stage_run_starts_from_its_own_pretraining_run(ran):
    _, out = ran
    for variant in ("l2-h2", "l1-h4"):
        for seed in (0, 1):
            source = out / "runs" / variant / f"seed{seed}"
            run = out / "stages" / "order" / "runs" / variant / f"seed{seed}"
            summary = json.loads((run / "summary.json").read_text())
            assert summary["status"] == "completed"
            assert summary["init_from"] == {"run": str(source), "checkpoint": None}
            cfg = read_toml(run / "config.toml")
            assert cfg["task"]["tokenizer_from"] == str(source) and cfg["train"]["seed"] == seed
            assert cfg["model"]["n_layers"] == read_toml(source / "config.toml")["model"]["n_layers"]
    rows = list(csv.DictReader((out / "stages" / "order" / "results.csv").open()))
    assert [(r["variant"], r["seed"], r["status"]) for r in rows] == [
        ("l2-h2", "0", "completed"), ("l2-h2", "1", "completed"), ("l1-h4", "0", "completed"),
        ("l1-h4", "1", "completed")]
    assert all(r["eval_accuracy"] for r in rows)


@pytest.mark.slow
def test_the_report_lays_out_table_1_and_judges_the_stage(ran):
    _, out = ran
    report = (out / "report" / "report.md").read_text()
    assert "## Table 1: depth for heads in pretrained encoders" in report
    scores = {v: [100 * float(r["eval_accuracy"]) for r in csv.DictReader(
        (out / "stages" / "order" / "results.csv").open()) if r["variant"] == v] for v in ("l2-h2", "l1-h4")}
    mean = sum(scores["l1-h4"]) / 2
    assert f"| `l1-h4` | 1 | 4 x 8 | {mean:.2f} ± " in report
    assert "## Verdicts on the papers' claims" in report and "1 x 4 as good as 2 x 2" in report
    assert "`l1-h4` vs `l2-h2`" in report and "| 2 |" in report  # two paired seeds from the stage's runs


@pytest.mark.slow
def test_a_rerun_finds_every_run_and_stage_run_finished(ran, capsys):
    path, out = ran
    capsys.readouterr()
    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 already finished, 0 to run" in printed and "stage order: 4 runs finished, 0 to run" in printed


def test_a_stage_waits_for_a_source_run_that_did_not_complete_and_skips_a_diverged_one(tmp_path):
    from headwise.plans import Plan
    from headwise.run import RunStatus, RunSummary, write_summary
    from headwise.study.jobs import plan_stage_jobs

    study = resolve_study(_study(), "test")
    (tmp_path / "runs" / "l2-h2" / "seed0").mkdir(parents=True)  # started, no summary: failed or killed
    write_summary(tmp_path / "runs" / "l1-h4" / "seed1", RunSummary(
        status=RunStatus.DIVERGED, params=1, plan=Plan.explicit([4], [8])))
    jobs, done, waiting, diverged = plan_stage_jobs(study, Path(tmp_path), study.config.stages[0])
    assert jobs == [] and done == []
    assert waiting == ["l2-h2/seed0", "l2-h2/seed1", "l1-h4/seed0"] and diverged == ["l1-h4/seed1"]


def test_a_stage_whose_data_cannot_be_had_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    """The stage's data is read before anything is written, although its runs start only after
    the pretraining: a missing GLUE folder costs no pretraining."""
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    missing = tmp_path / "no-glue"
    stage = {**GLUE_STAGE, "config": {"task": {"kind": "glue", "task": "rte", "source": str(missing)}}}
    path = tmp_path / "study.toml"
    path.write_text(tomli_w.dumps(_study(stages=[stage], claims=[])))
    out = tmp_path / "out"
    assert main(["study", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rte from" in err and "no run was started" in err, err
    assert not out.exists()
