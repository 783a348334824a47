"""Bad inputs in what a study asks of its runs, refused when the study is resolved (``headwise
study FILE --dry-run`` and a real run alike) rather than after its pretraining: ``[[stages]]`` that
cannot start from the study's runs (a GLUE stage that only borrows a causal LM's vocabulary among
them), ``[nuisance]`` grids and selections no run accepts or that change nothing, claims on metrics
the runs do not report (a GLUE stage's named by its ``[task]`` table: sst2 has no F1, only MNLI a
mismatched split). Then ``headwise report`` on a study
directory whose ``study.toml`` no longer fits its runs (edited after them, or saved by another
headwise) or whose ``tuning/tuning.json`` is damaged, output folders that cannot be written (a
mock of the permission check, so the cases hold as root too), a warm-up starting above its peak
learning rate and a damaged image cache's name.

Each case runs in-process (:func:`bad_input_harness.run_case`): one line on stderr naming what is
wrong, exit status 2 (1 for a damaged file), no traceback, nothing on disk changed and, for bad
input, no new file. Every study file here is a good one (:data:`GOOD`, each dry-run first) with one
mistake; the study directories are written by hand (:func:`write_study_dir`) from a good one.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import tomli_w

from bad_input_harness import Case, c, run_case, snapshot
from conftest import REPO
from headwise.cli import main
from headwise.config import read_toml
from helpers import one_thread, tiny_nearest_config, write_run_dir  # noqa: F401  (one torch thread)

NEAREST = tiny_nearest_config(2, 1, 0)
LM = {"model": {"preset": "tiny-lm", "d_model": 32, "n_layers": 1, "heads": [2], "max_seq_len": 32},
      "task": {"kind": "lm", "source": "tinystories-train-sample.txt", "validation": "tinystories-valid-sample.txt",
               "tokenizer": "bpe:300", "block_size": 32},
      "train": {"steps": 1}}
MLM = {"model": {"preset": "crammed-bert-tiny", "n_layers": 1, "max_seq_len": 32},
       "task": {"kind": "mlm", "source": "tinystories-train-sample.txt", "validation": "tinystories-valid-sample.txt",
                "tokenizer": "bpe:300", "block_size": 32},
       "train": {"steps": 1}}
LRA = {"model": {"d_model": 16, "n_layers": 1, "heads": [2], "head_dim": 8, "causal": False, "pooling": "mean",
                 "max_seq_len": 128},
       "task": {"kind": "lra", "task": "listops", "listops": {"variant": "short", "n_train": 40, "n_val": 10,
                                                              "n_test": 10}},
       "train": {"steps": 1}}
LR = "optim.lr"
TUNED = {"values": {LR: [0.001, 0.01, 0.1]}, "selection": {"task.eval_seed": 99}}
GLUE = {"name": "glue", "source_keys": ["train.init_from", "task.tokenizer_from"],
        "config": {"task": {"kind": "glue", "task": "standin", "max_length": 32}, "train": {"steps": 1}}}
PICK = {"name": "two heads help", "metric": "pick_accuracy", "better": "higher", "pairs": [["h2", "h1"]]}
SST2 = {**GLUE, "config": {**GLUE["config"], "task": {**GLUE["config"]["task"], "task": "sst2"}}}
GLUE_CLAIM = {**PICK, "metric": "accuracy", "stage": "glue"}


def study(base: dict, **tables) -> dict:
    """A study of ``base`` with variants ``h1`` (one head) and ``h2`` (two of half the width), and
    ``tables`` (``[nuisance]``, ``[[stages]]``, ``[[claims]]`` ...) beside them."""
    width = base["model"].get("d_model", 128)  # crammed-bert-tiny's when the base does not say
    variants = [{"name": "h1", "set": {"model.heads": [1], "model.head_dim": width}},
                {"name": "h2", "set": {"model.heads": [2], "model.head_dim": width // 2}}]
    return {"name": "mini", "base": copy.deepcopy(base), "variants": variants, **copy.deepcopy(tables)}


def edit(data: dict, key: str, value) -> dict:
    """A copy of ``data`` with dotted ``key`` set (a list index as a part: ``stages.0.config``)."""
    out = copy.deepcopy(data)
    *path, last = key.split(".")
    node = out
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return out


#: good study files: each dry-runs (test_the_good_studies_resolve); every bad one below is one of them, edited
GOOD = {
    "tuned": study(NEAREST, nuisance=TUNED, claims=[PICK]),
    "lm": study(LM),
    "mlm-glue": study(MLM, stages=[GLUE]),
    "mlm-sst2-claim": study(MLM, stages=[SST2], claims=[GLUE_CLAIM]),
    "mlm-mnli-claim": study(MLM, stages=[edit(SST2, "config.task.task", "mnli")],
                            claims=[{**GLUE_CLAIM, "metric": "accuracy_mismatched"}]),
    "mlm-pretrain-more": study(MLM, stages=[{"name": "more", "config": {"task": MLM["task"], "train": {"steps": 1}}}]),
    "lra": study(LRA, nuisance={**TUNED, "selection": {"task.eval_split": "val"}},
                 claims=[{**PICK, "metric": "accuracy"}]),
}
BAD = {
    # [[stages]] that can never start from the study's runs
    "stage-glue-on-lm": edit(GOOD["lm"], "stages", [GLUE]),
    "stage-glue-on-nearest": edit(GOOD["tuned"], "stages", [GLUE]),
    "stage-glue-vocabulary-only-on-lm": edit(edit(GOOD["lm"], "stages", [GLUE]), "stages.0.source_keys",
                                             ["task.tokenizer_from"]),
    "stage-lm-from-nearest": edit(GOOD["tuned"], "stages", [{"name": "lm", "config": LM}]),
    "stage-changes-the-encoder": edit(GOOD["mlm-glue"], "stages.0.config.model", {"d_model": 64}),
    "stage-vocabulary-of-another-run": edit(edit(GOOD["mlm-glue"], "stages.0.source_keys", ["train.init_from"]),
                                            "stages.0.config.task.tokenizer_from", "elsewhere"),
    "stage-no-vocabulary-run": edit(GOOD["mlm-glue"], "stages.0.source_keys", ["train.init_from"]),
    "stage-unknown-kind": edit(GOOD["mlm-glue"], "stages.0.config.task.kind", "glu"),
    "stage-unknown-glue-task": edit(GOOD["mlm-glue"], "stages.0.config.task.task", "wnli"),
    "stage-no-config": edit(GOOD["mlm-glue"], "stages", [{"name": "glue"}]),
    "stage-config-not-table": edit(GOOD["mlm-glue"], "stages.0.config", 5),
    "stage-no-source-keys": edit(GOOD["mlm-glue"], "stages.0.source_keys", []),
    "stage-source-key-typo": edit(GOOD["mlm-glue"], "stages.0.source_keys", ["train.init_frm", "task.tokenizer_from"]),
    "stage-name": edit(GOOD["mlm-glue"], "stages.0.name", "glue task"),
    "stage-defaults-not-table": {**GOOD["mlm-glue"], "stage_defaults": 3},
    # [nuisance] grids no run accepts, and selections that change nothing
    "nuisance-lr-zero": edit(GOOD["tuned"], "nuisance.values", {LR: [0, 1e-3, 1e-2]}),
    "nuisance-unknown-key": edit(GOOD["tuned"], "nuisance.values", {"optim.learning_rate": [1e-3, 1e-2, 1e-1]}),
    "nuisance-unknown-table": edit(GOOD["tuned"], "nuisance.values", {"optimizer.lr": [1e-3, 1e-2, 1e-1]}),
    "nuisance-no-values": edit(GOOD["tuned"], "nuisance.values", {}),
    "nuisance-two-values": edit(GOOD["tuned"], "nuisance.values", {LR: [1e-3, 1e-2]}),
    "nuisance-values-repeat": edit(GOOD["tuned"], "nuisance.values", {LR: [1e-3, 1e-3, 1e-2]}),
    "nuisance-values-text": edit(GOOD["tuned"], "nuisance.values", {LR: ["low", "mid", "high"]}),
    "nuisance-negative-weight-decay": edit(GOOD["tuned"], "nuisance.values", {"optim.weight_decay": [-0.1, 0, 0.1]}),
    "nuisance-warmup-frac-above-1": edit(GOOD["tuned"], "nuisance.values", {"schedule.warmup_frac": [0.5, 1, 2]}),
    "nuisance-fractional-batch": edit(GOOD["tuned"], "nuisance.values", {"train.micro_batch": [4, 8.5, 16]}),
    "nuisance-extends-below-zero": edit(GOOD["tuned"], "nuisance.values", {"optim.weight_decay": [0, 0.05, 0.1]}),
    "nuisance-lr-below-warmup-start": edit(
        {**GOOD["tuned"], "base": {**NEAREST, "schedule": {"warmup_steps": 1, "warmup_start_lr": 0.005}}},
        "nuisance.extend", 0),
    "nuisance-selection-default": edit(GOOD["tuned"], "nuisance.selection", {"task.eval_seed": 1234}),
    "nuisance-selection-as-the-base": edit(GOOD["tuned"], "base.task.eval_seed", 99),
    "nuisance-selection-test-split": edit(GOOD["lra"], "nuisance.selection", {"task.eval_split": "test"}),
    "nuisance-selection-typo": edit(GOOD["tuned"], "nuisance.selection", {"task.eval_sed": 99}),
    "nuisance-selection-empty": edit(GOOD["tuned"], "nuisance.selection", {}),
    "nuisance-tuned-and-selected": edit(GOOD["tuned"], "nuisance.selection", {LR: 0.5, "task.eval_seed": 99}),
    "nuisance-metric-unknown": edit(edit(GOOD["tuned"], "nuisance.metric", "accuracy"), "nuisance.better", "higher"),
    "nuisance-seed-reported": edit(GOOD["tuned"], "nuisance.seeds", [0, 1000]),
    # claims on metrics the runs do not report
    "claim-accuracy-on-nearest": edit(GOOD["tuned"], "claims.0.metric", "accuracy"),
    "claim-misspelled-metric": edit(GOOD["tuned"], "claims.0.metric", "pick_acuracy"),
    "claim-accuracy-on-lm": {**GOOD["lm"], "claims": [{**PICK, "metric": "accuracy"}]},
    "claim-top5-on-listops": edit(GOOD["lra"], "claims.0.metric", "top5_accuracy"),
    "claim-on-a-stage-s-family": {**GOOD["mlm-pretrain-more"],
                                  "claims": [{**PICK, "metric": "accuracy", "stage": "more"}]},
    "claim-metric-not-text": edit(GOOD["tuned"], "claims.0.metric", 3),
    # claims on metrics a GLUE stage does not report
    "claim-f1-on-sst2": edit(GOOD["mlm-sst2-claim"], "claims.0.metric", "f1"),
    "claim-mismatched-on-sst2": edit(GOOD["mlm-sst2-claim"], "claims.0.metric", "accuracy_mismatched"),
    "claim-matched-on-mnli": edit(GOOD["mlm-mnli-claim"], "claims.0.metric", "accuracy_matched"),
    "claim-spearman-on-stsb": edit(edit(GOOD["mlm-sst2-claim"], "stages.0.config.task.task", "stsb"),
                                   "claims.0.metric", "spearman"),
    "claim-masked-accuracy-on-glue": edit(GOOD["mlm-sst2-claim"], "claims.0.metric", "masked_accuracy"),
    "claim-unknown-variant": edit(GOOD["tuned"], "claims.0.pairs", [["h2", "h3"]]),
}
FILES = {f"{name}.toml": tomli_w.dumps(data) for name, data in {**GOOD, **BAD}.items()}


def dry(name: str, *words: str, code: int = 2, **kw) -> Case:
    """``headwise study NAME.toml --dry-run``."""
    return c(name, "study", f"{name}.toml", "--dry-run", says=words, code=code, **kw)


def real(name: str, *words: str) -> Case:
    """``headwise study NAME.toml --out new-study``: refused as the dry run is, before writing."""
    return c(f"{name}-real-run", "study", f"{name}.toml", "--out", "new-study", says=words)


CASES = [
    dry("stage-glue-on-lm", "variant 'h1'", "stage 'glue' cannot start from its runs",
        "reads its vocabulary from a 'mlm' run", "the study's runs are 'lm' runs"),
    real("stage-glue-on-lm", "stage 'glue' cannot start from its runs"),
    dry("stage-glue-on-nearest", "reads its vocabulary from a 'mlm' run", "the study's runs are 'nearest' runs"),
    dry("stage-glue-vocabulary-only-on-lm", "stage 'glue' cannot start from its runs",
        "its 'glue' task reads its vocabulary from a 'mlm' run, and the study's runs are 'lm' runs"),
    real("stage-glue-vocabulary-only-on-lm", "reads its vocabulary from a 'mlm' run"),
    dry("stage-lm-from-nearest", "train.init_from", "'vectors' models without a token encoder"),
    dry("stage-changes-the-encoder", "whose d_model is 128", "d_model = 64"),
    dry("stage-vocabulary-of-another-run", "vocabulary from", "elsewhere", "add the task's key to source_keys"),
    dry("stage-no-vocabulary-run", "stage 'glue'", "tokenizer_from"),
    dry("stage-unknown-kind", "unknown task kind 'glu'"),
    dry("stage-unknown-glue-task", "stage 'glue'", "wnli"),
    dry("stage-no-config", "stage 'glue'", "missing required key 'task'"),
    dry("stage-config-not-table", "`config` must be a table"),
    dry("stage-no-source-keys", "source_keys"),
    dry("stage-source-key-typo", "did you mean 'init_from'"),
    dry("stage-name", "stage name 'glue task'"),
    dry("stage-defaults-not-table", "stage_defaults"),
    dry("nuisance-lr-zero", "optim.lr = 0", "variant 'h1'", "greater than 0"),
    real("nuisance-lr-zero", "optim.lr = 0"),
    dry("nuisance-unknown-key", "optim.learning_rate = 0.001", "unknown key 'optim.learning_rate'", "valid keys: lr"),
    dry("nuisance-unknown-table", "unknown key 'optimizer'"),
    dry("nuisance-no-values", "nuisance.values"),
    dry("nuisance-two-values", "at least three values"),
    dry("nuisance-values-repeat", "values repeat"),
    dry("nuisance-values-text", "nuisance.values", "number"),
    dry("nuisance-negative-weight-decay", "optim.weight_decay = -0.1", "weight_decay"),
    dry("nuisance-warmup-frac-above-1", "schedule.warmup_frac = 2", "warmup_frac"),
    dry("nuisance-fractional-batch", "train.micro_batch = 8.5", "fractional"),
    dry("nuisance-extends-below-zero", "optim.weight_decay may be extended to -0.1", "extend = 2", "lower extend"),
    dry("nuisance-lr-below-warmup-start", "optim.lr = 0.001", "warmup_start_lr 0.005 is above optim.lr 0.001"),
    dry("nuisance-selection-default", "selection task.eval_seed = 1234", "already", "the report compares on"),
    dry("nuisance-selection-as-the-base", "selection task.eval_seed = 99", "already"),
    dry("nuisance-selection-test-split", "selection task.eval_split = 'test'", "already"),
    real("nuisance-selection-test-split", "selection task.eval_split = 'test'"),
    dry("nuisance-selection-typo", "[nuisance] selection", "did you mean 'eval_seed'"),
    dry("nuisance-selection-empty", "nuisance.selection"),
    dry("nuisance-tuned-and-selected", "optim.lr is both tuned", "not both"),
    dry("nuisance-metric-unknown", "[nuisance] metric 'accuracy'", "'nearest' runs report only the loss, "
        "pick_accuracy"),
    c("nuisance-seed-reported", "study", "nuisance-seed-reported.toml", "--seeds", "2", "--dry-run",
      says=("tuning seed 0", "seeds >= 2")),
    dry("claim-accuracy-on-nearest", "claim 'two heads help'", "'accuracy'", "report only the loss, pick_accuracy",
        "did you mean 'pick_accuracy'"),
    real("claim-accuracy-on-nearest", "claim 'two heads help'"),
    dry("claim-misspelled-metric", "'pick_acuracy'", "did you mean 'pick_accuracy'"),
    dry("claim-accuracy-on-lm", "'lm' runs report only the loss"),
    dry("claim-top5-on-listops", "'top5_accuracy'", "'lra' runs report only the loss, accuracy"),
    dry("claim-on-a-stage-s-family", "stage 'more' of variant 'h2'", "did you mean 'masked_accuracy'"),
    dry("claim-metric-not-text", "claims.metric", "string"),
    dry("claim-unknown-variant", "names variant 'h3'"),
    dry("claim-f1-on-sst2", "claim 'two heads help' compares stage 'glue'", "'f1'",
        "'glue' runs report only the loss, accuracy"),
    real("claim-f1-on-sst2", "'f1'", "report only the loss, accuracy"),
    dry("claim-mismatched-on-sst2", "'accuracy_mismatched'", "'glue' runs report only the loss, accuracy"),
    dry("claim-matched-on-mnli", "'accuracy_matched'", "report only the loss, accuracy, accuracy_mismatched"),
    dry("claim-spearman-on-stsb", "'spearman'", "pearson, spearmanr", "did you mean 'spearmanr'"),
    dry("claim-masked-accuracy-on-glue", "'masked_accuracy'", "'glue' runs report only the loss, accuracy"),
]


# --- headwise report on study directories that no longer fit their runs --------------------------


def write_study_dir(root: Path, name: str, claims: list[dict], nuisance: dict | None = None,
                    metrics: dict[str, float] | None = None) -> Path:
    """A study directory as ``headwise study`` leaves it, its runs written by hand (2 variants x 2
    seeds, completed, recording ``metrics`` beside the loss), declaring ``claims`` (and
    ``nuisance``) as the study file it ran from did."""
    from headwise.plans import Plan
    from headwise.run import RunStatus, RunSummary
    from headwise.study import load_study
    from headwise.study.layout import run_dir, save_study

    source = root / f"{name}-source.toml"
    tables = {"claims": claims, **({"nuisance": nuisance} if nuisance else {})}
    source.write_text(tomli_w.dumps({**study(NEAREST, **tables), "seeds": 2}))
    resolved = load_study(str(source))
    source.unlink()
    out = root / name
    save_study(resolved, out, 2)
    for k, v in enumerate(resolved.variants):
        plan = Plan.from_dict({"scheme": "explicit", "heads": v.config["model"]["heads"], "head_dims": [8]})
        for seed in (0, 1):
            loss = 0.5 - 0.1 * k + 0.01 * seed
            summary = RunSummary(status=RunStatus.COMPLETED, final_eval_loss=loss, last_eval_loss=loss, params=100,
                                 plan=plan, steps=2, tokens=32, tokens_per_step=16,
                                 eval_metrics=dict(metrics or {"pick_accuracy": 0.25 + 0.1 * k}))
            write_run_dir(run_dir(out, v.name, seed), v.config, summary, [{"step": 2, "eval_loss": loss}], seed)
    return out


def edit_claims(study_dir: Path, claims: list[dict]) -> None:
    """Rewrite the claims of a study directory's ``study.toml``, as an edit after the runs would."""
    data = read_toml(study_dir / "study.toml")
    data["definition"]["claims"] = claims
    (study_dir / "study.toml").write_text(tomli_w.dumps(data))


def write_report_world(root: Path) -> None:
    """The study directories the report cases read: ``rep-ok`` and one copy per damage."""
    ok = write_study_dir(root, "rep-ok", [PICK])
    for name, claims in (("rep-ghost", [{**PICK, "pairs": [["h2", "ghost"]]}]),
                         ("rep-metric", [{**PICK, "metric": "pick_acuracy"}]),
                         ("rep-stage", [{**PICK, "stage": "glue"}]),
                         ("rep-claim-test", [{**PICK, "test": "maybe"}])):
        shutil.copytree(ok, root / name)
        edit_claims(root / name, claims)
    # runs that did not record the metric their task declares (saved by another headwise)
    write_study_dir(root, "rep-recorded", [PICK], metrics={"accuracy": 0.5})
    # GLUE runs: their [task] table names the metrics they record (sst2: accuracy alone)
    glue = write_study_dir(root, "rep-glue", [PICK], metrics={"accuracy": 0.5})
    for config in glue.glob("runs/*/*/config.toml"):
        data = read_toml(config)
        data["task"] = {"kind": "glue", "task": "sst2", "tokenizer_from": "/nowhere"}
        config.write_text(tomli_w.dumps(data))
    edit_claims(glue, [{**PICK, "metric": "f1"}])
    tuned = write_study_dir(root, "rep-tuned", [PICK], nuisance=TUNED)
    (tuned / "tuning").mkdir()
    choice = {"variant": "h1", "tried": {"lr0.01": [{LR: 0.01}, 0.5]}, "best": {LR: 0.01}, "at_edge": [],
              "extensions": {}, "seeds": [1000, 1001]}
    text = json.dumps([choice, {**choice, "variant": "h2"}], indent=1)
    for name, damaged in (("rep-tuning-cut", text[:len(text) // 2]), ("rep-tuning-table", '{"h1": 1}'),
                          ("rep-tuning-fields", json.dumps([{"variant": "h1"}]))):
        shutil.copytree(tuned, root / name)
        (root / name / "tuning" / "tuning.json").write_text(damaged)
    (tuned / "tuning" / "tuning.json").write_text(text)


CASES += [
    c("report-claim-ghost-variant", "report", "rep-ghost", says=("rep-ghost/study.toml", "names variant 'ghost'",
                                                                  "correct its [[claims]]")),
    c("report-claim-misspelled-metric", "report", "rep-metric",
      says=("'pick_acuracy'", "did you mean 'pick_accuracy'")),
    c("report-claim-unknown-stage", "report", "rep-stage", says=("stage 'glue'", "stages: none")),
    c("report-claim-damaged", "report", "rep-claim-test", says=("study.toml", "test")),
    c("report-claim-metric-not-recorded", "report", "rep-recorded",
      says=("'pick_accuracy'", "none of its 4 completed runs recorded", "the loss, accuracy")),
    c("report-claim-glue-metric", "report", "rep-glue",
      says=("rep-glue/study.toml", "'f1'", "'glue' runs report only the loss, accuracy")),
    c("report-tuning-json-cut", "report", "rep-tuning-cut", code=1, says=("tuning.json is damaged", "rerun the study")),
    c("report-tuning-json-table", "report", "rep-tuning-table", code=1, says="tuning.json is damaged"),
    c("report-tuning-json-fields", "report", "rep-tuning-fields", code=1, says="tuning.json is damaged"),
    # a warm-up that starts above the peak it climbs to
    c("train-warmup-start-above-peak", "train", "nn.toml", "--out", "new-run", "--set", "schedule.warmup_start_lr=0.1",
      says=("warmup_start_lr 0.1 is above optim.lr 0.01", "at or below")),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The study files, the report's study directories, the nearest-neighbour config and one
    tiny run trained from it."""
    root = tmp_path_factory.mktemp("bad-inputs-studies")
    for name, text in FILES.items():
        (root / name).write_text(text)
    shutil.copy(REPO / "configs" / "nearest-tiny.toml", root / "nn.toml")
    write_report_world(root)
    old = Path.cwd()
    os.chdir(root)
    try:
        assert main(["train", "nn.toml", "--out", "run", "--set", "train.steps=2", "--set", "eval.every=0"]) == 0
    finally:
        os.chdir(old)
    return root


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_good_studies_resolve(name: str, world: Path, monkeypatch, capsys) -> None:
    """What every bad study file is an edit of dry-runs: the refusals are their mistakes alone."""
    monkeypatch.chdir(world)
    assert main(["study", f"{name}.toml", "--dry-run"]) == 0, capsys.readouterr().err


def test_the_good_report_and_warm_up_pass(world: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The report cases' study directories differ from a good one by their damage alone, and a
    warm-up from below the peak trains."""
    for name in ("rep-ok", "rep-tuned"):
        shutil.copytree(world / name, tmp_path / name)
        assert main(["report", str(tmp_path / name), "--no-samples", "--no-conditioning"]) == 0, capsys.readouterr().err
    assert "## Verdicts" in (tmp_path / "rep-ok" / "report" / "report.md").read_text()
    assert "## Tuning" in (tmp_path / "rep-tuned" / "report" / "report.md").read_text()
    monkeypatch.chdir(world)
    assert main(["train", "nn.toml", "--out", str(tmp_path / "warm"), "--set", "train.steps=2", "--set",
                 "schedule.warmup_start_lr=0.01"]) == 0


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id, marks=k.marks) for k in CASES])
def test_bad_study_input(case: Case, world: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    run_case(case, world, monkeypatch, capsys, leftovers=("new-run", "new-study"))


def test_case_ids_are_distinct_and_every_bad_file_is_used() -> None:
    ids = [k.id for k in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 50
    assert {f"{name}.toml" for name in BAD} <= {a for k in CASES for a in k.argv}


# --- output folders that cannot be written ------------------------------------------------------


READ_ONLY = [
    c("train-into-read-only", "train", "nn.toml", "--out", "ro/new-run", says=("ro", "is not writable", "--out")),
    c("train-resume-read-only-run", "train", "--resume", "--out", "ro/run", says=("ro/run", "is not writable")),
    c("study-into-read-only", "study", "tuned.toml", "--out", "ro/new-study", says=("ro", "is not writable")),
    c("report-read-only-study", "report", "ro/rep-ok", says=("ro/rep-ok", "is not writable", "report")),
    c("export-into-read-only", "export", "run", "--hf", "ro/exported", says=("--hf", "ro", "is not writable")),
]


@pytest.fixture(scope="module")
def read_only(world: Path) -> Path:
    """``ro/`` in the world: a run and a study directory in a folder the cases may not write."""
    (world / "ro").mkdir()
    shutil.copytree(world / "run", world / "ro" / "run")
    shutil.copytree(world / "rep-ok", world / "ro" / "rep-ok")
    return world / "ro"


def deny_writes(monkeypatch, folder: Path) -> None:
    """Make ``os.access`` say that ``folder`` and everything in it is not writable (as chmod would
    for anyone but root, who may write anywhere)."""
    real = os.access
    denied = folder.resolve()

    def access(path, mode, *args, **kwargs):
        resolved = Path(path).resolve()
        if mode & os.W_OK and (resolved == denied or denied in resolved.parents):
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def test_the_same_outputs_are_written_where_they_may_be(world: Path, read_only: Path, monkeypatch, capsys) -> None:
    """Without the mock the same commands write there: the refusals below are the permission
    check's alone."""
    monkeypatch.chdir(world)
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    before = snapshot(read_only / "rep-ok")
    try:
        assert main(["train", "nn.toml", "--out", "ro/new-run", "--set", "train.steps=1"]) == 0
        assert main(["report", "ro/rep-ok", "--no-samples", "--no-conditioning"]) == 0
    finally:
        shutil.rmtree(read_only / "new-run", ignore_errors=True)
        shutil.rmtree(read_only / "rep-ok" / "report", ignore_errors=True)
    assert snapshot(read_only / "rep-ok") == before
    capsys.readouterr()


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id) for k in READ_ONLY])
def test_a_read_only_output_is_refused(case: Case, world: Path, read_only: Path, monkeypatch, capsys) -> None:
    deny_writes(monkeypatch, read_only)
    monkeypatch.setenv("HEADWISE_CACHE", str(world / "cache"))
    run_case(case, world, monkeypatch, capsys, leftovers=("ro/new-run", "ro/new-study", "ro/exported"))


# --- a damaged image cache is named for what it is ----------------------------------------------


def test_an_image_cache_whose_metadata_is_garbled_is_not_called_a_token_cache(tmp_path, monkeypatch, capsys):
    from test_image_data import write_idx_folder

    from headwise.families.vision.cache import prepare_images

    write_idx_folder(tmp_path / "imgs", gz=False, n_train=8, n_test=4, size=(8, 8), classes=4)
    prepare_images(tmp_path / "imgs", cache_dir=tmp_path / "cache")
    (cache,) = (tmp_path / "cache").iterdir()
    assert main(["data", "verify", str(cache)]) == 0
    meta = cache / "meta.json"
    good = meta.read_text()
    for damage, says in ((good[:40], "meta.json is not valid JSON"),
                         (json.dumps({**json.loads(good), "kind": "imagez"}), "records kind 'imagez'")):
        meta.write_text(damage)
        case = c("verify-garbled", "data", "verify", str(cache), code=1, says=(str(cache), says, "--rebuild"))
        run_case(case, tmp_path, monkeypatch, capsys)
        assert main(["data", "verify", str(cache)]) == 1
        assert "token cache" not in capsys.readouterr().err
