"""One trial's run: an ordinary headwise run through the study's worker, watched on its eval curve.

The run is ``python -m headwise.study.worker LOCK -- train CONFIG --out SEARCH/trials/NNNN``
(:class:`headwise.study.jobs.RunJob`): the worker holds the trial's lock and dies with the driver,
and a run that was stopped resumes from its checkpoint. While it trains, the driver reads its
``metrics.jsonl`` every :data:`POLL_S` seconds and reports each new evaluation of the objective
to Optuna (``trial.report(value, step)``), asking the pruner after each one, so the decision
depends on the curve alone, not on when the driver looked. A pruned run is sent SIGTERM (it
checkpoints and stops, as on Ctrl-C); its ``steps`` are those of the last evaluation reported.

Where the run runs is the launcher's business (:class:`LocalLauncher`: a subprocess here;
:class:`RayLauncher`: a Ray task that runs the same worker on a node of the cluster, which the
driver stops by cancelling the task). Either gives a :class:`Launched` handle, so watching and
pruning do not depend on where the run is: the driver reads its metrics from the search folder,
which every node must see at the same path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import tomli_w

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError, RunFailure
from headwise.run import RunStatus, read_metrics, read_summary
from headwise.search.definition import Search
from headwise.study.definition import RunSpec
from headwise.study.jobs import RunJob, open_log, plan_action
from headwise.study.preflight import check_here
from headwise.study.ray_backend import connect, prepare_on_cluster, ray_train, submit_run
from headwise.study.runner import child_env

#: seconds between two reads of a running trial's metrics
POLL_S = 0.5


@dataclass
class TrialOutcome:
    """How a trial's run ended, in Optuna's terms."""

    #: "complete", "pruned", "failed", or "stopped" (the driver is stopping: the trial stays running)
    state: str
    values: list[float] | None = None
    #: the objective's last reported value, by metric (a pruned trial's values)
    last: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0
    note: str = ""


def eval_key(metric: str) -> str:
    """The key of an evaluation of ``metric`` in metrics.jsonl rows."""
    return "eval_loss" if metric == "loss" else f"eval_{metric}"


def objective_values(search: Search, summary: Any, budget: dict[str, int]) -> tuple[list[float] | None, str]:
    """The objectives of a completed run (eval metrics from its summary, budget metrics from its
    plan), or None and why one is missing."""
    values = []
    for o in search.config.objectives:
        if o.from_budget:
            values.append(float(budget[o.metric]))
            continue
        value = summary.final_eval_loss if o.metric == "loss" else summary.eval_metrics.get(o.metric)
        if value is None:
            return None, f"the run reported no final {o.metric}"
        values.append(float(value))
    return values, ""


class Launched(Protocol):
    """A trial's run once launched, wherever it runs."""

    def poll(self) -> bool:
        """True once the run has ended (by itself, stopped, or lost)."""

    def stop(self) -> None:
        """Ask the run to checkpoint and stop (it gets SIGTERM); returns at once."""

    def wait(self) -> None:
        """Wait for the run to end."""


class _Process:
    """A run as a subprocess of this machine."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def poll(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:  # it ended between the look and the signal
                pass

    def wait(self) -> None:
        self.proc.wait()


class LocalLauncher:
    """Trials as subprocesses of this machine."""

    def preflight(self, specs: list[RunSpec], folder: Path, threads: int, echo: Callable[[str], None]) -> None:
        """Refuse CUDA trials on a machine without CUDA; prepare the data here."""
        check_here(specs, echo)

    def launch(self, job: RunJob, threads: int) -> Launched:
        """Start the job's worker here on ``threads`` torch threads, logging to its log."""
        with open_log(job) as log:  # the run writes to its own copy of the descriptor
            return _Process(subprocess.Popen([sys.executable, *job.argv()], stdout=log, stderr=subprocess.STDOUT,
                                             env=child_env(threads)))

    def close(self) -> None:
        """Nothing to give back."""


class _RayRun:
    """A run as a Ray task (:func:`headwise.study.ray_backend.ray_train`)."""

    def __init__(self, ray: Any, ref: Any) -> None:
        self.ray, self.ref = ray, ref

    def poll(self) -> bool:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        return bool(ready)

    def stop(self) -> None:
        self.ray.cancel(self.ref)  # the task SIGTERMs its run, which checkpoints, then ends

    def wait(self) -> None:
        try:
            self.ray.get(self.ref)
        except Exception:  # noqa: BLE001 - cancelled, or its node lost: the run's summary says how it ended
            pass


def _exists(path: str) -> bool:
    """The body of the shared-folder probe: whether this node sees ``path``."""
    return os.path.exists(path)


class RayLauncher:
    """Trials as Ray tasks on the cluster at ``address`` (None: a local one, or the one this
    process joined already), each running the trial's worker (one GPU when it trains on CUDA)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.ray: Any = None
        self.started_here = False
        self.gpus = 0.0
        self.task: Any = None  # the remote ray_train, once joined
        self.lock = threading.Lock()  # trials launch from their own threads

    def _connect(self) -> Any:
        with self.lock:
            if self.ray is None:
                self.ray, self.started_here = connect(self.address)
                self.gpus = self.ray.cluster_resources().get("GPU", 0)
                self.task = self.ray.remote(ray_train)
        return self.ray

    def preflight(self, specs: list[RunSpec], folder: Path, threads: int, echo: Callable[[str], None]) -> None:
        """Join the cluster, refuse a search folder some node does not see, then refuse CUDA
        trials on a cluster without GPUs and prepare the data on the cluster."""
        ray = self._connect()
        self._check_shared(ray, folder)
        prepare_on_cluster(ray, specs, threads, echo, "search")

    def _check_shared(self, ray: Any, folder: Path) -> None:
        """Refuse a search folder that an alive node with CPUs does not see at the same path: a
        probe file made here, beside it, must be visible there (the trials write their runs into
        the folder and the driver reads their metrics from it). Nodes that join later are not
        checked."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = Path(os.path.abspath(folder))
        while not where.is_dir():  # the folder itself is not made before every check passes
            where = where.parent
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        probe = ray.remote(_exists)
        fd, path = tempfile.mkstemp(prefix=".headwise-probe-", dir=where)
        os.close(fd)
        try:
            refs = [probe.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(path) for n in nodes]
            try:
                seen = ray.get(refs)
            except Exception as exc:  # a lost node or a crashed worker: not the user's input
                raise RunFailure(f"checking the search folder on the Ray cluster failed: {exc}") from None
        finally:
            os.unlink(path)
        blind = [n.get("NodeManagerAddress", n["NodeID"]) for n, ok in zip(nodes, seen) if not ok]
        if blind:
            raise HeadwiseError(f"--out {folder}: Ray node(s) {', '.join(blind)} do not see {where}; with --backend ray "
                                "the search folder must be on a filesystem every node sees at the same path")

    def launch(self, job: RunJob, threads: int) -> Launched:
        """Start the job's worker as a Ray task of ``threads`` CPUs, appending to its log."""
        ray = self._connect()
        return _RayRun(ray, submit_run(self.task, job, self.gpus, threads))

    def close(self) -> None:
        """Shut down the local cluster this launcher started (a joined one is left alone)."""
        if self.started_here:
            self.ray.shutdown()
            self.started_here = False


class TrialRun:
    """Runs one trial to its end (or its pruning), reporting to ``trial`` under ``lock``."""

    def __init__(self, search: Search, job: RunJob, trial: Any, lock: threading.RLock, threads: int,
                 budget: dict[str, int], stopping: threading.Event, on_start: Callable[[Launched], None],
                 launcher: LocalLauncher | RayLauncher | None = None):
        self.search, self.job, self.trial, self.lock, self.threads = search, job, trial, lock, threads
        self.budget, self.stopping, self.on_start = budget, stopping, on_start
        self.launcher = launcher or LocalLauncher()
        objectives = search.config.objectives
        #: report the curve only for one measured objective (Optuna reports nothing else)
        self.watched = objectives[0].metric if len(objectives) == 1 and not objectives[0].from_budget else None
        self.total = int(search.base["train"]["steps"])

    def _stored(self) -> Any:
        with self.lock:
            return self.trial.study._storage.get_trial(self.trial._trial_id)

    def _prune(self, step: int) -> bool:
        """Ask the pruner at ``step`` (under the lock); a decision to prune is kept in the store
        (``pruned_at``) before the run is stopped, since asking again would not give it
        (successive halving records the rung it judged the trial at)."""
        prune = step < self.total and self.trial.should_prune()
        if prune:
            self.trial.set_user_attr("pruned_at", step)
        return prune

    def run(self) -> TrialOutcome:
        t0 = time.monotonic()
        frozen = self._stored()
        reported = dict(frozen.intermediate_values)
        last: dict[str, float] = {}
        if reported and self.watched:
            step = max(reported)
            last = {self.watched: reported[step]}
            decided = frozen.user_attrs.get("pruned_at")
            if decided is not None:  # a driver stopped after the pruner's decision: it stands
                return TrialOutcome("pruned", last={self.watched: reported.get(decided, reported[step])},
                                    steps=int(decided), note="pruned")
            # a driver stopped between a report and the pruner's decision: decide first
            with self.lock:
                if self._prune(step):
                    return TrialOutcome("pruned", last=last, steps=step, note="pruned")
        action = plan_action(self.job.run_dir)
        if action is not None:
            self.job.action = action
            outcome = self._train(max(reported, default=-1), last)
            if outcome is not None:
                outcome.seconds = time.monotonic() - t0
                return outcome
        outcome = self._finish(last)
        outcome.seconds = time.monotonic() - t0
        return outcome

    def _train(self, reported: int, last: dict[str, float]) -> TrialOutcome | None:
        """Train (or resume) the run, reporting its evaluations; an outcome when it was pruned or
        the driver is stopping, None when the run ended by itself."""
        job = self.job
        atomic_write_text(job.config_path, tomli_w.dumps(job.spec.config))
        for path in (job.log_path, job.lock_path, job.run_dir):
            path.parent.mkdir(parents=True, exist_ok=True)
        key = eval_key(self.watched) if self.watched else None
        run = self.launcher.launch(job, self.threads)
        self.on_start(run)
        pruned_at = None
        while True:
            done = run.poll()
            if key is not None and pruned_at is None:
                for row in read_metrics(job.run_dir):
                    step, value = row["step"], row.get(key)
                    if step <= reported or not isinstance(value, (int, float)):
                        continue
                    with self.lock:
                        self.trial.report(float(value), step)
                        prune = self._prune(step)
                    reported, last[self.watched] = step, float(value)  # type: ignore[index]
                    if prune:
                        pruned_at = step
                        run.stop()  # the run checkpoints and stops
                        break
            if done:
                break
            time.sleep(POLL_S)  # at this pace while the driver stops too: the run needs the cores to checkpoint
        run.wait()
        if pruned_at is not None:
            return TrialOutcome("pruned", last=dict(last), steps=pruned_at, note="pruned")
        summary = read_summary(job.run_dir)
        if self.stopping.is_set() and (summary is None or summary.status is not RunStatus.COMPLETED):
            return TrialOutcome("stopped", last=dict(last))
        return None

    def _finish(self, last: dict[str, float]) -> TrialOutcome:
        summary = read_summary(self.job.run_dir)
        status = summary.status if summary is not None else RunStatus.FAILED
        if status is RunStatus.COMPLETED:
            values, why = objective_values(self.search, summary, self.budget)
            if values is not None:
                return TrialOutcome("complete", values=values, last=last, steps=summary.steps)
            return TrialOutcome("failed", steps=summary.steps, note=why)
        if status is RunStatus.DIVERGED:
            # a result, not a crash: the sampler learns from it as from a pruned trial
            return TrialOutcome("pruned", last=last, steps=summary.steps, note="diverged")  # type: ignore[union-attr]
        steps = summary.steps if summary is not None else 0
        return TrialOutcome("failed", steps=steps, note=f"run {status}; see {self.job.log_path}")

