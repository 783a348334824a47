"""Experiment trackers, offline: W&B's local run files and an MLflow file store hold what the run
wrote to ``metrics.jsonl``, ``summary.json`` and ``config.toml``; a resume continues the same
tracker runs; a study groups its runs; a missing extra or an unknown tracker is one line, exit 2."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.config import read_toml
from headwise.run.layout import CONFIG_FILE
from headwise.run.metrics import read_metrics, scan_metrics
from headwise.train import RunConfig, run_training
from headwise.train.config import LogConfig
from headwise.train.trackers import IDS_FILE, TRACKERS, numbers, read_ids

from helpers import one_line_error, one_thread, tiny_nearest_config  # noqa: F401 - the fixture applies to this module

BASE = tiny_nearest_config(steps=20, log_every=5, every=10)

# W&B's records of one run: the steps' rows, the summary (updates merged in order), the config.
WANDB_FULL, WANDB_LAST = 1, 4  # chunk types of the .wandb log (one record whole; the last of several)
WANDB_BLOCK = 32768


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """W&B offline and silent, its own files under tmp_path; no MLflow server."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def config(tmp_path: Path, **log) -> RunConfig:
    return RunConfig.parse({**BASE, "log": log})


def wandb_files(run_dir: Path) -> list[Path]:
    """The offline ``.wandb`` files of a run's W&B runs (one per start or resume), once complete:
    W&B's service writes them out a moment after ``finish()`` returns."""
    paths = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + 30
    while not all(_has_exit(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    return paths


def _has_exit(path: Path) -> bool:
    return any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path))


def wandb_records(path: Path) -> list:
    """The records of an offline ``.wandb`` file (a log of 32 KiB blocks of chunks, each with a
    7-byte header: checksum, length, type; a block's last bytes are padding when fewer than 7
    remain)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, records, pending = 7, [], b""
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk still being written
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (WANDB_FULL, WANDB_LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(items) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def wandb_run(path: Path) -> dict:
    """What one W&B run recorded: its history by step, summary, run record and config."""
    history, summary, run = {}, {}, None
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = _items(r.history.item)
            history[r.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            summary.update(_items(r.summary.update))
        elif kind == "run":
            run = r.run
    return {"history": history, "summary": summary, "run": run, "config": _items(run.config.update)}


def metric_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    rows, _ = scan_metrics(run_dir)
    return {r["step"]: {k: v for k, v in numbers(r).items() if k != "step"} for r in rows}


def test_log_table_round_trips_and_refuses_unknown_trackers(tmp_path):
    cfg = config(tmp_path, trackers=["wandb", "mlflow"], project="p", mlflow_uri="file:///x")
    cfg.save(tmp_path / "c.toml")
    assert RunConfig.load(tmp_path / "c.toml") == cfg
    assert read_toml(tmp_path / "c.toml")["log"] == {"trackers": ["wandb", "mlflow"], "project": "p",
                                                       "mlflow_uri": "file:///x"}
    # unset trackers (TensorBoard when installed) stays unset in the saved config
    RunConfig.parse(BASE).save(tmp_path / "d.toml")
    assert read_toml(tmp_path / "d.toml")["log"] == {"project": "headwise"}
    message = one_line_error(LogConfig.parse, {"trackers": ["neptune"]})
    assert "unknown tracker 'neptune'" in message and ", ".join(sorted(TRACKERS)) in message
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps({**BASE, "log": {"trackers": ["tensorbord"]}}))
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_wandb_offline_holds_the_runs_metrics_summary_and_config(tmp_path):
    out = tmp_path / "run"
    summary = run_training(config(tmp_path, trackers=["wandb"], group="g1"), out)
    [path] = wandb_files(out)
    logged = wandb_run(path)
    rows = metric_rows(out)
    assert sorted(rows) == [5, 10, 15, 20]
    assert logged["history"] == rows
    on_disk = json.loads((out / "summary.json").read_text())
    assert numbers(on_disk) and all(logged["summary"][k] == v for k, v in numbers(on_disk).items())
    assert logged["summary"]["final_eval_loss"] == summary.final_eval_loss
    assert logged["summary"]["status"] == "completed"
    run = logged["run"]
    assert run.run_id == read_ids(out)["wandb"] and run.run_group == "g1" and run.job_type == "train"
    saved = read_toml(out / "config.toml")
    assert logged["config"]["optim"] == saved["optim"] and logged["config"]["model"] == saved["model"]
    assert not (out / "tb").exists()


def test_mlflow_file_store_holds_the_runs_metrics_summary_and_params_and_resume_continues_it(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "store").as_uri()
    out = tmp_path / "run"
    cfg = config(tmp_path, trackers=["mlflow", "wandb"], mlflow_uri=uri, project="exp")
    short = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 10})})
    run_training(short, out)
    ids = read_ids(out)
    resumed = run_training(cfg, out, resume=True)  # 10 more steps, the same tracker runs
    assert resumed.status == "completed" and resumed.steps == 20
    assert read_ids(out) == ids
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    rows = metric_rows(out)
    for key in ("train_loss", "lr", "tokens", "eval_loss"):
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert history == {s: r[key] for s, r in rows.items() if key in r}, key
    on_disk = json.loads((out / "summary.json").read_text())
    assert run.data.metrics["summary.final_eval_loss"] == on_disk["final_eval_loss"]
    assert run.data.metrics["summary.steps"] == 20
    assert run.data.params["optim.lr"] == "0.01" and run.data.params["model.heads"] == "[1]"
    # W&B: the resumed run has the first run's id
    assert [wandb_run(p)["run"].run_id for p in wandb_files(out)] == [ids["wandb"]] * 2


def test_a_missing_extra_is_one_line_and_changes_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({**BASE, "train": {**BASE["train"], "steps": 5}, "log": {"trackers": []}}))
    assert main(["train", str(path), "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails, as when not installed
    capsys.readouterr()
    for flags in (["--overwrite"], ["--resume"]):
        code = main(["train", str(path), "--out", str(out), "--set", 'log.trackers=["wandb"]', *flags])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert 'pip install -c requirements.lock -e ".[wandb]"' in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert main(["train", str(path), "--out", str(tmp_path / "new"), "--set", 'log.trackers=["wandb"]']) == 2
    assert not (tmp_path / "new").exists()


def test_missing_tensorboard_is_skipped_by_default_and_refused_when_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    cfg = RunConfig.parse({**BASE, "train": {**BASE["train"], "steps": 5}})
    assert run_training(cfg, tmp_path / "a").status == "completed"
    assert not (tmp_path / "a" / "tb").exists() and not (tmp_path / "a" / IDS_FILE).exists()
    named = cfg.model_copy(update={"log": LogConfig(trackers=["tensorboard"])})
    message = one_line_error(run_training, named, tmp_path / "b")
    assert '".[tensorboard]"' in message and not (tmp_path / "b").exists()


def fake_report(study_dir: Path) -> Path:
    """A report of one figure (the real one is tested in test_report.py)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out = study_dir / "report"
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2], [2, 1])
    fig.savefig(out / "loss_vs_heads.png")
    plt.close(fig)
    (out / "report.md").write_text("# report\n")
    return out / "report.md"


def test_a_study_groups_its_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    from headwise.study import load_study, run_study

    src = tmp_path / "mini.toml"
    base = {**BASE, "train": {**BASE["train"], "steps": 10}, "log": {"trackers": ["wandb", "mlflow", "tensorboard"]}}
    src.write_text(tomli_w.dumps({"name": "mini", "base": base,
                                  "variants": [{"name": "a", "set": {}}, {"name": "b", "set": {"optim.lr": 0.02}}]}))
    out = tmp_path / "study"
    outcome = run_study(load_study(str(src)), out, jobs=2, report=fake_report, echo=lambda line: None)
    assert [r.status for r in outcome.results] == ["completed", "completed"]
    runs = sorted(p for p in out.rglob(CONFIG_FILE) if p.parent.name != "configs" and (p.parent / "wandb").is_dir())
    assert len(runs) == 2
    # W&B: one group, the study directory's name; the report's figures in a "report" run of it
    logged = [wandb_run(p)["run"] for r in runs for p in wandb_files(r.parent)]
    assert [(r.run_group, r.job_type, r.display_name) for r in logged] == [("study", "train", "a/seed0"),
                                                                             ("study", "train", "b/seed0")]
    [report] = [wandb_run(p) for p in wandb_files(out)]
    assert (report["run"].run_group, report["run"].job_type) == ("study", "report")
    figure = out / "report" / "loss_vs_heads.png"
    assert report["summary"]["loss_vs_heads/sha256"] == hashlib.sha256(figure.read_bytes()).hexdigest()
    # MLflow: one parent run in the study's store, both runs nested under it, figures its artifacts
    client = MlflowClient((out / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("headwise").experiment_id
    parent = read_ids(out)["mlflow"]
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(c.info.run_id for c in children) == sorted(read_ids(r.parent)["mlflow"] for r in runs)
    assert len(client.search_runs([experiment])) == 3
    assert client.get_run(parent).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent, "figures")] == ["figures/loss_vs_heads.png"]
    assert sorted(c.info.run_name for c in children) == ["a/seed0", "b/seed0"]
    # each run's saved config records the group it joined
    assert {read_toml(r)["log"]["mlflow_parent"] for r in runs} == {parent}
    # TensorBoard: the figures as images in the study's own tb/
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert events.Tags()["images"] == ["loss_vs_heads"]


def test_a_study_refuses_a_missing_extra_before_writing_and_trackers_are_not_its_identity(tmp_path, monkeypatch):
    from headwise.study import load_study, run_study

    def study_file(name: str, log: dict) -> Path:
        path = tmp_path / name
        path.write_text(tomli_w.dumps({"name": "mini", "base": {**BASE, "log": log},
                                       "variants": [{"name": "a", "set": {}}]}))
        return path

    plain = load_study(str(study_file("plain.toml", {})))
    logged = load_study(str(study_file("logged.toml", {"trackers": ["wandb"]})))
    assert plain.identity() == logged.identity()
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert '".[wandb]"' in one_line_error(run_study, logged, tmp_path / "study", echo=lambda line: None)
    assert not (tmp_path / "study").exists()


def test_tensorboard_holds_the_runs_metrics_config_and_summary_and_a_resume_purges_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    # trackers unset: TensorBoard, as it is installed; the last checkpoint is step 10's, so a
    # resume goes back to it and logs step 15 again
    cfg = RunConfig.parse({**BASE, "checkpoint": {"every": 10, "at_end": False}})
    run_training(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 15})}), out)
    run_training(cfg, out, resume=True)
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    rows = metric_rows(out)
    assert sorted(rows) == [5, 10, 15, 20]
    for key in ("train_loss", "lr", "eval_loss"):
        logged = events.Scalars(key)  # one event per step: the first run's step 15 was purged
        expected = {s: r[key] for s, r in rows.items() if key in r}
        assert [e.step for e in logged] == list(expected), key
        assert [e.value for e in logged] == pytest.approx(list(expected.values())), key  # stored as float32
    assert {"config/text_summary", "summary/text_summary"} <= set(events.Tags()["tensors"])


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, capsys):
    from headwise.train.metrics import MetricsLog
    from headwise.train.trackers import Tracker

    class Flaky(Tracker):
        name, package, extra = "flaky", "json", "flaky"

        def log_metrics(self, row, step):
            if step == 2:
                raise ConnectionError("server gone")
            seen.append(step)

    seen: list[int] = []
    log = MetricsLog(tmp_path, trackers=[Flaky(LogConfig(), tmp_path)])
    for step in (1, 2, 3):
        log.write({"step": step, "train_loss": 1.0 / step})
    log.close()
    assert seen == [1] and [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tracker flaky failed at step 2 and is dropped" in err and "server gone" in err


def test_an_mlflow_resume_whose_run_is_not_in_the_store_starts_a_new_run(tmp_path, capsys):
    from headwise.train.trackers import save_id
    from headwise.train.trackers.mlflow import MlflowTracker

    save_id(tmp_path, "mlflow", "0123456789abcdef")  # a run of a store this URI does not point at
    tracker = MlflowTracker(LogConfig(trackers=["mlflow"], mlflow_uri=f"file:{tmp_path / 'other'}"), tmp_path)
    tracker.start({"train": {"steps": 5}}, resume_step=3)
    assert tracker.run_id != "0123456789abcdef" and read_ids(tmp_path)["mlflow"] == tracker.run_id
    tracker.finish("completed")
    assert "is not in the store" in capsys.readouterr().err
