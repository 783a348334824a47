"""The study runner: resumable, one failing run never stops the others, results.csv, refusals,
a killed study finishes on rerun without redoing finished runs (the Ray backend:
tests/test_search_ray.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.errors import HeadwiseError, RunFailure
from headwise.study import load_study, run_study
from headwise.config import read_toml
from headwise.study.layout import load_study_record, save_study
from headwise.plans import Plan
from headwise.run import RunStatus, RunSummary, read_summary, write_summary
from headwise.study.jobs import plan_action
from headwise.study.runner import prepare_study_dir

from helpers import read_csv, wait_for

BASE = {
    "model": {"preset": "amsel-nn", "d_model": 8, "heads": 1, "head_dim": 8, "mlp_hidden": 16, "max_seq_len": 16},
    "task": {"kind": "nearest", "dim": 8, "n_points": 4, "eval_batches": 1, "eval_batch_size": 32},
    "optim": {"lr": 0.01, "weight_decay": 0.0},
    "train": {"micro_batch": 16, "steps": 20, "device": "cpu", "log_every": 10},
    "eval": {"every": 10},
    "checkpoint": {"every": 10, "keep": 1},
}


def write_study(path: Path, variants: list[dict], name: str = "mini", base: dict = BASE) -> Path:
    path.write_text(tomli_w.dumps({"name": name, "base": base, "variants": variants}))
    return path


def quiet(_line: str) -> None:
    pass


def test_study_runs_records_failures_and_reruns_resumably(tmp_path):
    (tmp_path / "train.txt").write_text("A cat sat.\n<|endoftext|>\nA dog ran.\n")
    (tmp_path / "valid.txt").write_text("A bird sang.\n")
    src = write_study(tmp_path / "mini.toml", [
        {"name": "one-head", "set": {}},
        # passes every check before the runs (spec, data) but the run fails: its data holds fewer
        # tokens than one block
        {"name": "broken", "set": {"task": {"kind": "lm", "source": str(tmp_path / "train.txt"),
                                            "validation": str(tmp_path / "valid.txt"), "block_size": 32,
                                            "cache_dir": str(tmp_path / "cache")},
                                   "model.preset": "tiny-lm", "model.d_model": 8, "model.head_dim": 8,
                                   "model.mlp_hidden": 16, "model.max_seq_len": 32}},
        {"name": "two-heads", "set": {"model.heads": 2, "model.head_dim": 4}},
    ])
    out = tmp_path / "study"
    lines: list[str] = []
    with pytest.raises(RunFailure, match=r"1 of 3 runs did not complete: broken/seed0"):
        run_study(load_study(str(src)), out, echo=lines.append)
    assert any("[3/3]" in line for line in lines)  # the failure did not stop the run after it
    record = load_study_record(out)
    assert record.name == "mini" and record.seeds == 1
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    assert rows["broken"]["status"] == "failed" and rows["one-head"]["status"] == "completed"
    assert "fewer than one block" in rows["broken"]["error"]  # why it failed, from its log
    for name in ("one-head", "two-heads"):
        summary = read_summary(out / "runs" / name / "seed0")
        row = rows[name]
        assert float(row["final_eval_loss"]) == pytest.approx(summary.final_eval_loss, rel=1e-5)
        assert int(row["params"]) == summary.params and int(row["total_heads"]) == summary.total_heads
        assert row["heads"] == " ".join(map(str, summary.heads)) and row["scheme"] == "explicit"
    assert rows["two-heads"]["heads"] == "2" and rows["two-heads"]["head_dims"] == "4"
    assert (out / "configs" / "one-head-seed0.toml").is_file() and (out / "study.toml").is_file()
    finished = (out / "runs" / "one-head" / "seed0" / "summary.json").stat().st_mtime_ns

    # rerun: completed runs are skipped, the failed one is tried again (and fails again)
    lines.clear()
    with pytest.raises(RunFailure):
        run_study(load_study(str(src)), out, echo=lines.append)
    assert "2 already finished, 1 to run" in lines[0]
    assert (out / "runs" / "one-head" / "seed0" / "summary.json").stat().st_mtime_ns == finished
    assert (out / "logs" / "broken-seed0.log").read_text().count("====") == 2


def test_output_dir_of_another_study_is_refused(tmp_path, capsys):
    a = write_study(tmp_path / "a.toml", [{"name": "x", "set": {}}], name="a")
    b = write_study(tmp_path / "b.toml", [{"name": "x", "set": {"optim.lr": 0.02}}], name="a")
    out = tmp_path / "study"
    study_a = load_study(str(a))
    run_study(study_a, out, echo=quiet)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert main(["study", str(b), "--out", str(out), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a different study" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    # a rerun of the same study finds nothing to do; more seeds run only the new ones
    again = run_study(load_study(str(a)), out, echo=quiet)
    assert again.ran == [] and again.skipped == ["x/seed0"]
    more = run_study(load_study(str(a), seeds=2), out, echo=quiet)
    assert more.ran == ["x/seed1"] and more.skipped == ["x/seed0"]
    assert load_study_record(out).seeds == 2 and [r.seed for r in more.results] == [0, 1]
    assert read_summary(out / "runs" / "x" / "seed1").status is RunStatus.COMPLETED
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(HeadwiseError, match="not empty and holds no study"):
        run_study(study_a, other, echo=quiet)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_a_study_keeps_the_thread_count_its_runs_used(tmp_path, capsys, monkeypatch):
    src = write_study(tmp_path / "a.toml", [{"name": "x", "set": {}}], name="a")
    out = tmp_path / "study"
    run_study(load_study(str(src)), out, threads=1, echo=quiet)
    env = load_study_record(out).environment
    # the installed package's version (read without importing torch; a CUDA wheel's torch.__version__
    # adds its build, "+cu130", which the package's metadata does not)
    assert env["threads"] == 1 and env["torch"] == __import__("importlib.metadata").metadata.version("torch")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    # the numbers of a run depend on its thread count: a rerun asking for another is refused
    assert main(["study", str(src), "--out", str(out), "--threads", "2", "--seeds", "2", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ran its runs with 1 torch thread(s) each" in err and "--threads 1" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    # without --threads a rerun takes the recorded count, even where the default would differ
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    more = run_study(load_study(str(src), seeds=2), out, echo=quiet)
    assert more.ran == ["x/seed1"] and load_study_record(out).environment["threads"] == 1
    # another torch version would mix two versions' numbers in one study
    monkeypatch.setattr("headwise.study.runner.installed_version", lambda name: "0.0.1")
    with pytest.raises(HeadwiseError, match="ran under torch .*, this is torch 0.0.1"):
        run_study(load_study(str(src), seeds=3), out, echo=quiet)


def test_cli_bad_input_is_one_line_before_any_run(tmp_path, capsys):
    src = write_study(tmp_path / "bad.toml", [{"name": "fine", "set": {}}, {"name": "zero", "set": {"model.heads": 0}}])
    out = tmp_path / "study"
    assert main(["study", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "variant 'zero'" in err and not out.exists()
    assert main(["study", "progression", "--preset", "huge"]) == 2
    assert "no preset 'huge'" in capsys.readouterr().err
    assert main(["study", "nosuchstudy"]) == 2
    assert main(["study", "progression", "--backend", "local", "--address", "auto", "--dry-run"]) == 0
    assert "constant-h45" in capsys.readouterr().out


def test_only_a_committed_checkpoint_makes_a_run_resume(tmp_path):
    run = tmp_path / "run"
    assert plan_action(run) == "start"
    (run / "checkpoints" / ".tmp_step_00000025").mkdir(parents=True)  # a save cut short
    write_summary(run, _summary(RunStatus.INTERRUPTED))
    assert plan_action(run) == "restart"
    (run / "checkpoints" / "step_00000025").mkdir()
    (run / "checkpoints" / "step_00000025" / "trainer.pt").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text("step_00000025")
    assert plan_action(run) == "resume"
    write_summary(run, _summary(RunStatus.COMPLETED))
    assert plan_action(run) is None


def _summary(status: RunStatus) -> RunSummary:
    return RunSummary(status=status, params=1, plan=Plan.explicit((1,), (8,)))


@pytest.mark.slow
def test_killed_study_finishes_on_rerun_without_redoing_finished_runs(tmp_path):
    slow = {**BASE, "model": {**BASE["model"], "d_model": 16, "head_dim": 16, "mlp_hidden": 128},
            "task": {**BASE["task"], "dim": 16, "n_points": 8},
            "train": {**BASE["train"], "micro_batch": 32, "steps": 400},
            "checkpoint": {"every": 25, "keep": 1}, "eval": {"every": 100}}
    src = write_study(tmp_path / "kill.toml", [{"name": "first", "set": {"train.steps": 20}},
                                               {"name": "second", "set": {}}], base=slow)
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "headwise", "study", str(src), "--out", str(out), "--no-report"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = out / "runs" / "second" / "seed0"
    try:
        wait_for(lambda: (second / "checkpoints").is_dir() and any((second / "checkpoints").iterdir()), 120,
                  "a checkpoint of the second run")
        first_done = (out / "runs" / "first" / "seed0" / "summary.json").stat().st_mtime_ns
        proc.send_signal(signal.SIGKILL)  # the runner dies at once; its run is told to stop
        proc.wait(timeout=30)
        # the run saw its parent die (SIGTERM): it checkpoints, says so and exits
        wait_for(lambda: getattr(read_summary(second), "status", None) is RunStatus.INTERRUPTED, 60, "the run to stop")
        stopped_at = read_summary(second).steps
        assert 0 < stopped_at < 400
    finally:
        if proc.poll() is None:
            proc.kill()
    lines: list[str] = []
    outcome = run_study(load_study(str(src)), out, echo=lines.append)
    assert outcome.skipped == ["first/seed0"] and outcome.ran == ["second/seed0"]
    assert any("resuming second/seed0" in line for line in lines)
    assert (out / "runs" / "first" / "seed0" / "summary.json").stat().st_mtime_ns == first_done
    summary = read_summary(second)
    assert summary.status is RunStatus.COMPLETED and summary.steps == 400
    steps = [json.loads(line)["step"] for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 400  # one continuous record, no step twice
    assert "--resume" in (out / "logs" / "second-seed0.log").read_text()


def test_a_study_saved_with_another_report_table_is_the_same_study(tmp_path):
    # study.toml files written before the paper values moved into [report] (or by a user who
    # changed only how the study is shown) still match the study on a rerun
    src = write_study(tmp_path / "s.toml", [{"name": "x", "set": {}}])
    study = load_study(str(src))
    save_study(study, tmp_path / "out", seeds=1)
    saved = read_toml(tmp_path / "out" / "study.toml")
    saved["definition"]["report"] = {"kind": "heads", "at_heads": 4}
    saved["fingerprint"] = "0123456789abcdef"
    (tmp_path / "out" / "study.toml").write_text(tomli_w.dumps(saved))
    assert prepare_study_dir(study, tmp_path / "out", seeds_given=False) == 1
    saved["definition"]["base"]["optim"]["lr"] = 0.5  # what is run did change: another study
    (tmp_path / "out" / "study.toml").write_text(tomli_w.dumps(saved))
    with pytest.raises(HeadwiseError, match="holds a different study"):
        prepare_study_dir(study, tmp_path / "out", seeds_given=False)


def test_an_axis_named_like_a_typed_column_keeps_its_own_column():
    import csv
    import io

    from headwise.study.results import COLUMNS, RunResult, axis_column, rows_to_csv
    from headwise.plans import Scheme

    summary = RunSummary(status=RunStatus.COMPLETED, params=10, plan=Plan.of(Scheme.DESCENDING, (4, 2)))
    result = RunResult(variant="v", seed=0, labels={"scheme": "my label", "budget": "h6"},
                       status=RunStatus.COMPLETED, run_dir="runs/v/seed0", summary=summary)
    axes = ["scheme", "budget"]
    columns = ["variant", "seed", *map(axis_column, axes), *COLUMNS]
    assert len(set(columns)) == len(columns) and columns[2:4] == ["scheme_label", "budget"]
    (row,) = csv.DictReader(io.StringIO(rows_to_csv([result.csv_row(axes)], columns)))
    # the axis label and the plan's typed scheme each in their own column
    assert row["scheme_label"] == "my label" and row["scheme"] == "descending" and row["budget"] == "h6"
