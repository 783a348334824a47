"""``headwise search --backend ray``: each trial's run a Ray task on a local cluster, the driver
here. A search ends with the record and folder of a local one; a trial the pruner stops is
stopped on the cluster (even when ``ray.cancel`` does not reach its task), checkpoints and ends
pruned; without Ray the command refuses in one line and writes nothing. And ``headwise study
--backend ray``: a study's runs on the cluster, stopped with the study, and its data checked there
before any run.

Every test that starts a local Ray cluster is in this file and shares its one cluster: pytest-xdist
(``--dist loadfile``, pyproject.toml) runs a file's tests on one worker, so no two clusters start
at once (they would share the machine's two CPUs and Ray's default ports)."""

from __future__ import annotations

import sys

import pytest

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.run import RunStatus, read_summary
from headwise.search.trials import read_record
from headwise.study import load_study, run_study
from test_search_driver import trial_pruned_at_step_20, write_search
from test_study_preflight import lm_study
from test_study_runner import quiet, write_study

#: the keys of a trial in trials.json, in order (headwise.search.trials)
RECORD_KEYS = ["number", "state", "params", "depth", "heads", "head_dims", "kv_heads", "mlp_hidden", "budget", "lr",
               "repaired", "values", "steps", "run_dir", "duplicate_of", "named", "startup", "note"]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster of two CPUs for the module (starting one takes seconds)."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'headwise[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_search_on_ray_makes_an_ordinary_search_folder(cluster, tmp_path, capsys):
    src = write_search(tmp_path / "s.toml", trials=2)  # the named plans: one round of two tasks
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out), "--jobs", "2", "--backend", "ray"]) == 0
    printed = capsys.readouterr().out
    assert "on Ray" in printed and "report:" in printed
    trials = read_record(out)["trials"]
    assert [t["number"] for t in trials] == [0, 1] and all(list(t) == RECORD_KEYS for t in trials)
    assert {t["state"] for t in trials} <= {"complete", "duplicate"} and trials[0]["state"] == "complete"
    for t in trials:
        assert set(t["values"]) == {"loss"} and t["steps"] == 30
        assert read_summary(out / t["run_dir"]).status is RunStatus.COMPLETED
    for t in (t for t in trials if t["state"] == "complete"):  # started once, its output in its log
        log = (out / "logs" / f"{t['number']:04d}.log").read_text()
        assert log.count("====") == 1 and "start trial" in log
    for name in ("search.toml", "optuna.db", "trials.json", "driver.json", "report"):
        assert (out / name).exists(), name
    assert not list(out.parent.glob(".headwise-probe-*"))  # the shared-folder probe is gone


@pytest.mark.slow
@pytest.mark.parametrize("cancel", ["delivered", "lost"])
def test_a_pruned_trial_on_ray_is_stopped_and_checkpoints(cluster, tmp_path, monkeypatch, cancel):
    """The task stops its run at the driver's stop file even when ``ray.cancel`` never reaches it
    (seen in whole-suite runs on torch 2.14.1: the pruned run trained to the end)."""
    from headwise.search.execute import RayLauncher

    if cancel == "lost":
        monkeypatch.setattr(cluster, "cancel", lambda *args, **kwargs: None)  # as if it never reached the task
    launcher = RayLauncher(None)
    outcome, _, job = trial_pruned_at_step_20(tmp_path, launcher)
    launcher.close()
    assert not launcher.started_here and cluster.is_initialized()  # a cluster it joined is left running
    assert outcome.state == "pruned" and outcome.steps == 20
    summary = read_summary(job.run_dir)  # the task ended once its run had checkpointed and stopped
    assert summary.status is RunStatus.INTERRUPTED and 20 <= summary.steps < 2000
    assert (job.run_dir / "checkpoints" / "latest").exists()
    assert not list(job.log_path.parent.glob("*.stop-*"))  # its stop file is gone with it


@pytest.mark.slow
def test_a_study_runs_on_a_local_cluster(cluster, tmp_path):
    src = write_study(tmp_path / "ray.toml", [{"name": "a", "set": {}}, {"name": "b", "set": {"model.heads": 2,
                                                                                             "model.head_dim": 4}}])
    outcome = run_study(load_study(str(src)), tmp_path / "study", backend="ray", echo=quiet)
    assert sorted(outcome.ran) == ["a/seed0", "b/seed0"] and not outcome.failed
    assert [r.status for r in outcome.results] == [RunStatus.COMPLETED] * 2
    assert read_summary(tmp_path / "study" / "runs" / "b" / "seed0").heads == (2,)


@pytest.mark.slow
def test_a_study_on_ray_that_is_stopped_stops_its_runs_without_ray_cancel(cluster, tmp_path, monkeypatch):
    import os
    import signal
    import threading

    from helpers import wait_for

    monkeypatch.setattr(cluster, "cancel", lambda *args, **kwargs: None)  # as if it never reached the task
    src = write_study(tmp_path / "ray.toml", [{"name": "long", "set": {"train.steps": 20000, "checkpoint.every": 50}}])
    run_dir = tmp_path / "study" / "runs" / "long" / "seed0"

    def stop_once_it_has_a_checkpoint():
        wait_for(lambda: any((run_dir / "checkpoints").glob("step_*")), 120, "a checkpoint")
        os.kill(os.getpid(), signal.SIGTERM)  # as a user stopping the study; it becomes KeyboardInterrupt

    threading.Thread(target=stop_once_it_has_a_checkpoint, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_study(load_study(str(src)), tmp_path / "study", backend="ray", echo=quiet)
    summary = read_summary(run_dir)
    assert summary.status is RunStatus.INTERRUPTED and summary.steps < 20000
    assert not list((tmp_path / "study").rglob("*.stop-*"))  # the stop file went once the run had ended


@pytest.mark.slow
def test_a_study_checks_its_data_on_the_cluster_first(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    src = lm_study(tmp_path / "s.toml", {"source": str(tmp_path / "absent.txt")})
    with pytest.raises(HeadwiseError, match="absent.txt.*not found"):
        run_study(load_study(str(src)), tmp_path / "study", backend="ray", echo=lambda _: None)
    assert not (tmp_path / "study").exists()


def test_without_ray_the_search_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    src = write_search(tmp_path / "s.toml")
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out), "--backend", "ray", "--dry-run"]) == 0  # runs nothing
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    assert main(["search", str(src), "--out", str(out), "--backend", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install 'headwise[ray]'" in err
    assert main(["search", str(src), "--out", str(out), "--address", "auto"]) == 2
    assert "--backend ray" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
