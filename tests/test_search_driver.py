"""The search's driver on real runs of the nearest-neighbour task (no data to prepare, a few
seconds a trial): a search killed mid-trial and rerun ends with the trials of an uninterrupted
one of the same seed; two drivers on one SQLite store run distinct trials, each once; the named
plans run first; a plan already run is never trained again; a pruned trial's run is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main
from headwise.run import RunStatus, read_summary
from headwise.search.store import draw
from headwise.search.trials import read_record
from helpers import one_thread, wait_for  # noqa: F401  (one_thread: one torch thread)

BASE = {
    "model": {"preset": "amsel-nn", "d_model": 16, "n_layers": 1, "heads": [1], "head_dim": 16, "mlp_hidden": 128,
              "max_seq_len": 16},
    "task": {"kind": "nearest", "dim": 16, "n_points": 8, "eval_batches": 1, "eval_batch_size": 32},
    "optim": {"lr": 0.01, "weight_decay": 0.0},
    "train": {"micro_batch": 32, "steps": 30, "device": "cpu", "log_every": 10},
    "eval": {"every": 10},
    "checkpoint": {"every": 10, "keep": 1},
}
NAMED = [{"name": "one-two", "heads": [1, 2]}, {"name": "two-one", "heads": [2, 1]}]
#: steps of a trial the kill-and-rerun test interrupts: enough that the kill lands mid-run
STEPS = 250


def write_search(path: Path, **over) -> Path:
    """A search of 1-2 layers of 1, 2 or 4 heads (head width 16) under 4 heads in all."""
    raw = {"name": "mini", "seed": 2, "trials": 4, "base": BASE, "space": {"depth": [1, 2], "heads": [1, 2, 4]},
           "budget": {"metric": "total_heads", "max": 4}, "named": NAMED, "confirm": {"enabled": False},
           "runner": {"threads": 1}}
    for key, value in over.items():
        raw[key] = value
    path.write_text(tomli_w.dumps(raw))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}


def _search(src: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "headwise", "search", str(src), "--out", str(out), "--jobs", "1",
                             *extra], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _trials(out: Path) -> list[dict]:
    """The record's trials without what differs between two runs of one search (nothing should)."""
    return read_record(out)["trials"]


def _kill_mid_trial_1(src: Path, out: Path) -> None:
    """Start the search of ``src`` into ``out``, SIGKILL its driver once trial 1 has checkpointed,
    and wait for that trial's run to stop (interrupted, its checkpoint written)."""
    proc = _search(src, out)
    second = out / "trials" / "0001"
    try:
        wait_for(lambda: (second / "checkpoints").is_dir() and any((second / "checkpoints").glob("step_*")), 240,
                 "a checkpoint of trial 1")
        proc.send_signal(signal.SIGKILL)  # the driver dies at once; its run is told to stop
        proc.wait(timeout=30)
        wait_for(lambda: getattr(read_summary(second), "status", None) is RunStatus.INTERRUPTED, 60, "the run to stop")
        stopped_at = read_summary(second).steps
        assert 0 < stopped_at < STEPS
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_search_killed_mid_trial_reruns_to_the_trials_of_an_uninterrupted_one(tmp_path, capsys):
    """Two trials, both queued at the start: the named plan, then one of TPE's startup plans, in
    which the driver is killed. A rerun that ran the finished trial again, renumbered one, or
    queued the first trials again (more trials) would not end with the uninterrupted search's."""
    slow = {**BASE, "train": {**BASE["train"], "steps": STEPS}, "checkpoint": {"every": 10, "keep": 1},
            "eval": {"every": 100}}
    src = write_search(tmp_path / "s.toml", base=slow, trials=2, named=NAMED[:1])
    out, reference = tmp_path / "killed", tmp_path / "reference"
    # the uninterrupted search runs beside the killed one: each run takes one thread of CI's two cores
    uninterrupted = _search(src, reference)
    try:
        _kill_mid_trial_1(src, out)
        before = json.loads((out / "trials.json").read_text())["trials"]
        assert [t["state"] for t in before] == ["complete", "running"]
        assert main(["search", str(src), "--out", str(out), "--jobs", "1"]) == 0
        log = uninterrupted.communicate(timeout=300)[0]
        assert uninterrupted.returncode == 0, log
    finally:
        if uninterrupted.poll() is None:  # the test failed before the reference ended
            uninterrupted.kill()
    assert _trials(out) == _trials(reference)  # same numbers, params, plans, values and steps
    assert [t["state"] for t in _trials(out)] == ["complete"] * 2
    assert (out / "logs" / "0000.log").read_text().count("====") == 1  # the finished trial ran once
    assert "resume" in (out / "logs" / "0001.log").read_text()  # resumed from its checkpoint, not restarted
    # run again: nothing is left to do
    capsys.readouterr()
    assert main(["search", str(src), "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert "2 already finished" in again and "started trial" not in again


@pytest.mark.slow
def test_two_drivers_on_one_store_run_distinct_trials_each_once(tmp_path):
    # 4 trials: two rounds of two drivers, and more than the first can run (one at a time, seconds
    # each) before the worker, started a second or two after it, asks for one
    src = write_search(tmp_path / "s.toml", trials=4)
    out = tmp_path / "shared"
    first = _search(src, out)
    # a worker joins a search: one the first driver has started (a folder without one is refused)
    wait_for(lambda: (out / "optuna.db").is_file() or first.poll() is not None, 120, "the first driver's store")
    second = _search(src, out, "--worker")
    logs = [p.communicate(timeout=300)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], logs
    trials = _trials(out)
    assert [t["number"] for t in trials] == [0, 1, 2, 3] and {t["state"] for t in trials} <= {"complete", "duplicate"}
    trained = [t for t in trials if t["state"] == "complete"]
    assert len({t["run_dir"] for t in trained}) == len(trained)
    for t in trained:  # each run started once: one header in its log, and it completed
        assert (out / "logs" / f"{t['number']:04d}.log").read_text().count("====") == 1
        assert read_summary(out / t["run_dir"]).status is RunStatus.COMPLETED
    started = [{int(line.split()[2].rstrip(":")) for line in log.splitlines() if line.strip().startswith("started trial")}
               for log in logs]
    assert started[0].isdisjoint(started[1]) and started[1], logs  # the worker ran some, none twice
    assert "(worker)" in logs[1]


@pytest.mark.slow
def test_named_plans_run_first_and_a_plan_run_before_is_not_trained_again(tmp_path, capsys):
    named = [{"name": "a", "heads": [2]}, {"name": "b", "heads": [2]}, {"name": "c", "heads": [1, 1]}]
    src = write_search(tmp_path / "s.toml", trials=3, named=named)
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out)]) == 0
    a, b, c = _trials(out)
    assert (a["named"], b["named"], c["named"]) == ("a", "b", "c") and a["heads"] == b["heads"] == [2]
    assert a["state"] == "complete" and b["state"] == "duplicate" and b["duplicate_of"] == 0
    assert b["values"] == a["values"] and b["run_dir"] == a["run_dir"] == "trials/0000" and b["steps"] == a["steps"]
    assert not (out / "trials" / "0001").exists() and (out / "trials" / "0002").is_dir()
    assert a["budget"] == {"params": a["budget"]["params"], "flops_per_token": a["budget"]["flops_per_token"],
                           "kv_bytes_per_token": 0, "total_heads": 2}  # bidirectional: no KV cache
    import optuna

    study = optuna.load_study(study_name="headwise-search", storage=f"sqlite:///{out / 'optuna.db'}")
    assert study.trials[1].user_attrs["heads"] == [2] and study.trials[1].user_attrs["duplicate_of"] == 0
    first = json.loads((out / "driver.json").read_text())
    assert "driver:" in capsys.readouterr().out and first["overhead"] < 0.5 and first["trials_run"] == 2
    # a rerun of the finished search runs no trial; the sitting that ran them is kept
    assert main(["search", str(src), "--out", str(out)]) == 0
    again = json.loads((out / "driver.json").read_text())
    assert again["trials_run"] == 0 and again["earlier"] == [first]


def trial_pruned_at_step_20(tmp_path, launcher=None):
    """One trial of a 2,000-step search whose pruner stops it at its step-20 evaluation, run by
    ``launcher`` (None: locally); its outcome, Optuna study and job."""
    import optuna

    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.execute import TrialRun
    from headwise.search.layout import trial_paths
    from headwise.study.definition import RunSpec
    from headwise.study.jobs import RunJob

    class AtTwenty(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return max(trial.intermediate_values, default=0) >= 20

    long = {**BASE, "train": {**BASE["train"], "steps": 2000}, "checkpoint": {"every": 500, "keep": 1}}
    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", base=long)))
    search = resolve_search(raw, source)
    study = optuna.create_study(pruner=AtTwenty())
    trial = study.ask()
    plan, _ = draw(search, trial)
    job = RunJob(spec=RunSpec("t", 100, {}, search.trial_config(plan)), action="start", **trial_paths(tmp_path, 0))
    outcome = TrialRun(search, job, trial, threading.RLock(), 1, search.budget_of(plan), threading.Event(),
                       lambda run: None, launcher).run()
    return outcome, study, job


@pytest.mark.slow
def test_a_pruned_trial_stops_its_run_at_the_prune_point(tmp_path):
    outcome, study, job = trial_pruned_at_step_20(tmp_path)
    assert outcome.state == "pruned" and outcome.steps == 20 and set(outcome.last) == {"loss"}
    assert sorted(study.trials[0].intermediate_values) == [10, 20]
    summary = read_summary(job.run_dir)
    assert summary.status is RunStatus.INTERRUPTED and summary.steps < 2000  # stopped, with a checkpoint


@pytest.mark.slow
def test_a_trial_pruned_before_its_driver_died_stays_pruned_when_taken_up(tmp_path):
    """Successive halving records the rung a trial was judged at, so asking it again at the same
    step says "go on": a driver that died between the pruner's decision and telling the store
    must not let the next driver train the pruned trial to its end."""
    import optuna

    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.execute import TrialRun
    from headwise.search.layout import trial_paths
    from headwise.study.definition import RunSpec
    from headwise.study.jobs import RunJob

    # far more steps than the run can take before the driver's next look at its metrics: a short
    # run could end before the stop reaches it, and the last check would prove nothing
    long = {**BASE, "train": {**BASE["train"], "steps": 20000}}
    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", base=long)))
    search = resolve_search(raw, source)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}",
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=10, reduction_factor=3))
    for _ in range(3):  # earlier trials that did far better at the first rung
        earlier = study.ask()
        earlier.report(0.0, 10)
        assert not earlier.should_prune()
        study.tell(earlier, 0.0)
    trial = study.ask()
    plan, _ = draw(search, trial)

    def run(t):
        job = RunJob(spec=RunSpec("t", 100, {}, search.trial_config(plan)), action="start", **trial_paths(tmp_path, 0))
        return TrialRun(search, job, t, threading.RLock(), 1, search.budget_of(plan), threading.Event(),
                        lambda proc: None).run()

    first = run(trial)
    assert first.state == "pruned" and first.steps == 10
    # the driver dies before telling the store; the next one takes the trial up under its number
    again = run(optuna.Trial(study, trial._trial_id))
    assert again.state == "pruned" and again.steps == 10 and again.last == first.last
    assert read_summary(trial_paths(tmp_path, 0)["run_dir"]).steps < 20000  # not trained on to its end


@pytest.mark.slow
def test_two_objectives_search_with_nsga2(tmp_path):
    # a named plan and one that NSGA-II samples, run side by side
    objectives = [{"metric": "loss"}, {"metric": "params", "direction": "minimize"}]
    src = write_search(tmp_path / "s.toml", trials=2, named=NAMED[:1], objectives=objectives)
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out), "--jobs", "2"]) == 0
    trials = _trials(out)
    assert trials[0]["named"] == "one-two" and trials[0]["state"] == "complete"
    assert all(set(t["values"]) == {"loss", "params"} for t in trials if t["state"] == "complete")
    assert all(t["values"]["params"] == t["budget"]["params"] for t in trials if t["state"] == "complete")


@pytest.mark.parametrize("pruner", ["successive_halving", "hyperband"])
def test_the_pruners_stop_trials_on_their_eval_curves(tmp_path, pruner):
    """No training: curves reported straight to the store, as the driver reports each evaluation."""
    import optuna

    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.store import open_storage, open_study

    long = {**BASE, "train": {**BASE["train"], "steps": 90}}
    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", base=long, trials=12,
                                                    fidelity={"pruner": pruner, "min_steps": 10})))
    search = resolve_search(raw, source)
    study = open_study(search, open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    states = []
    for n in range(12):
        trial = study.ask()
        draw(search, trial)
        for step in range(10, 100, 10):
            trial.report(1.0 + n / 10 + 1 / step, step)  # each trial worse than the last
            if step < 90 and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, 1.0 + n / 10)
        states.append(study.trials[-1].state.name)
    assert states[0] == "COMPLETE" and "PRUNED" in states, states


@pytest.mark.slow
def test_new_moves_the_earlier_search_aside(tmp_path, capsys):
    src = write_search(tmp_path / "s.toml", trials=1, named=NAMED[:1])  # one run before and one after the move
    out = tmp_path / "out"
    assert main(["search", str(src), "--out", str(out)]) == 0
    write_search(src, trials=1, named=NAMED[:1], space={"depth": [1, 2], "heads": [1, 2]})
    assert main(["search", str(src), "--out", str(out)]) == 2
    assert "defined differently (changed: space)" in capsys.readouterr().err
    assert main(["search", str(src), "--out", str(out), "--new"]) == 0
    assert "moved into" in capsys.readouterr().out
    assert (out / "previous-1" / "trials.json").is_file() and (out / "previous-1" / "optuna.db").is_file()
    assert [t["state"] for t in _trials(out)] == ["complete"] and (out / "trials" / "0000").is_dir()
    assert read_record(out / "previous-1")["trials"][0]["run_dir"] == "trials/0000"


def test_two_drivers_asking_at_once_do_not_overshoot_the_trial_count(tmp_path):
    """Both drivers see the search one trial short at the same moment: only one of them may ask
    for it (counting and asking are one step across drivers)."""
    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.driver import Driver
    from headwise.search.store import open_storage, open_study

    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", trials=1, named=[])))
    search = resolve_search(raw, source)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    open_study(search, open_storage(url))
    both_looked = threading.Barrier(2, timeout=3)
    asked: list[int] = []

    def driver() -> Driver:
        d = Driver(search, tmp_path, open_study(search, open_storage(url)), jobs=1, threads=1, main=False,
                   echo=lambda line: None)
        count, first = d._want_more, [True]

        def want_more() -> bool:
            more = count()
            if first.pop() if first else False:  # the first look of each waits for the other's
                try:
                    both_looked.wait()
                except threading.BrokenBarrierError:
                    pass
            return more

        d._want_more = want_more
        d._start_safely = lambda trial, adopted=False: asked.append(trial.number)  # runs nothing
        return d

    threads = [threading.Thread(target=driver().run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert asked == [0]
    assert len(open_study(search, open_storage(url)).trials) == 1


@pytest.mark.slow
def test_a_stopping_driver_does_not_spin_on_its_trials_metrics(tmp_path, monkeypatch):
    """While the driver stops, each trial's run gets time to checkpoint: its watcher keeps polling
    at its pace rather than reading metrics.jsonl in a loop (two cores, the runs need them)."""
    import optuna

    from headwise.search import execute
    from headwise.search.definition import load_search_file, resolve_search
    from headwise.search.layout import trial_paths
    from headwise.study.definition import RunSpec
    from headwise.study.jobs import RunJob

    raw, source = load_search_file(str(write_search(tmp_path / "s.toml", fidelity={"pruner": "successive_halving"})))
    search = resolve_search(raw, source)
    study = optuna.create_study()
    trial = study.ask()
    plan, _ = draw(search, trial)
    job = RunJob(spec=RunSpec("t", 100, {}, search.trial_config(plan)), action="start", **trial_paths(tmp_path, 0))
    reads = []
    monkeypatch.setattr(execute, "read_metrics", lambda run_dir: reads.append(1) or [])
    stopping = threading.Event()
    stopping.set()  # as after the driver's SIGTERM: its runs are told to stop, and it waits for them
    t0 = time.monotonic()
    execute.TrialRun(search, job, trial, threading.RLock(), 1, search.budget_of(plan), stopping,
                     lambda proc: None).run()
    assert len(reads) <= (time.monotonic() - t0) / execute.POLL_S + 3
