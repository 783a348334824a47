"""One trial's run: an ordinary headwise run through the study's worker, watched on its eval curve.

The run is ``python -m headwise.study.worker LOCK -- train CONFIG --out SEARCH/trials/NNNN``
(:class:`headwise.study.jobs.RunJob`): the worker holds the trial's lock and dies with the driver,
and a run that was stopped resumes from its checkpoint. While it trains, the driver reads its
``metrics.jsonl`` every :data:`POLL_S` seconds and reports each new evaluation of the objective
to Optuna (``trial.report(value, step)``), asking the pruner after each one, so the decision
depends on the curve alone, not on when the driver looked. A pruned run is sent SIGTERM (it
checkpoints and stops, as on Ctrl-C); its ``steps`` are those of the last evaluation reported.

Where the run runs is the launcher's business (:mod:`headwise.study.launch`, as for a study's
runs: :class:`LocalLauncher`, a subprocess here; :class:`RayLauncher`, a Ray task that runs the
same worker on a node of the cluster, which the driver stops by cancelling the task). Either gives
a :class:`Launched` handle, so watching and pruning do not depend on where the run is: the driver
reads its metrics from the search folder, which every node must see at the same path.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from headwise.run import RunStatus, read_metrics, read_summary
from headwise.search.definition import Search
from headwise.study.jobs import RunJob, plan_action
from headwise.study.launch import Launched, LocalLauncher, RayLauncher

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
        with self.lock:
            frozen = self.trial.study._storage.get_trial(self.trial._trial_id)
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
        outcome = None
        if action is not None:
            self.job.action = action
            outcome = self._train(max(reported, default=-1), last)
        outcome = outcome or self._finish(last)
        outcome.seconds = time.monotonic() - t0
        return outcome

    def _train(self, reported: int, last: dict[str, float]) -> TrialOutcome | None:
        """Train (or resume) the run, reporting its evaluations; an outcome when it was pruned or
        the driver is stopping, None when the run ended by itself."""
        job = self.job
        job.write_inputs()
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

