"""The search's driver: Optuna ask-and-tell over ordinary headwise runs, resumable and shared.

One driver (``headwise search``) asks the store for trials and runs up to ``jobs`` of them at a
time (:mod:`headwise.search.execute`), each under a claim: ``locks/NNNN.claim``, an flock held by
the driver for as long as it handles the trial. So:

- **Resumable.** A driver that starts finds the trials the store says are running; one whose
  claim it can take lost its driver: it takes it up under the same number, resuming the run from
  its checkpoint, then tells the store. No trial is lost or renumbered, and one that ended is
  never run again.
- **Shared.** A second driver on the same folder (or ``--worker``, on the same ``--storage``) asks
  for new trials and runs them; two drivers never hold one claim. The search stops at the
  search's trial count over the store (complete + pruned + duplicate; running ones counted as
  they will end; a driver counts and asks under ``locks/ask.lock``), so workers share it. Only
  the main driver (the one holding ``.lock``) waits for every trial and then runs the
  confirmation.
- **Deterministic.** Trial n samples with seed ``seed + n`` (:class:`~headwise.search.store.PlanSampler`)
  and its values, repaired as they are drawn, make a feasible plan (:func:`~headwise.search.store.draw`);
  with one job, a search killed and rerun makes the same trials as one never stopped.
- **Never twice.** A trial whose run config is an earlier trial's reuses that trial's values
  (``duplicate_of``) and trains nothing.

The named plans run first, then, with TPE, distinct plans drawn uniformly from the space's list
until they fill TPE's startup trials (:func:`enqueue_named`): all queued in the store once, as
their own values, before any trial is sampled.

Where a trial's run runs is its launcher's (:mod:`headwise.search.execute`): a subprocess here,
or a Ray task on a cluster. The driver, its claims and its reading of the runs' metrics stay in
this process either way; stopping it (Ctrl-C, SIGTERM) stops every run it launched, which
checkpoints, so its trial stays running in the store for the next driver to resume.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from headwise.search import layout
from headwise.budget import METRICS
from headwise.search.definition import Search
from headwise.search.execute import Launched, LocalLauncher, RayLauncher, TrialOutcome, TrialRun
from headwise.locks import FileLock
from headwise.plans import Plan
from headwise.search.trials import write_record
from headwise.study.definition import RunSpec
from headwise.study.definition_file import short_hash
from headwise.errors import sigterm_interrupts
from headwise.study.jobs import GRACE_S, RunJob

#: seconds between two looks at the store while waiting for other drivers' trials
WAIT_S = 1.0
#: TPE's startup trials, drawn before its model (Optuna's ``n_startup_trials``): the named plans
#: and uniform draws from the space's list fill them, which find better plans than Optuna's random
#: startup, whose per-layer draws repaired to the budget reach the plans unevenly (benchmarks/README.md)
STARTUP = 10
#: the most plans a space lists for its startup draws; a larger one keeps Optuna's random startup
LISTED = 100_000


@dataclass
class Timing:
    """What the driver spent beside its trials: its own CPU time, and the wall time of trials."""

    started: float = field(default_factory=time.monotonic)
    cpu0: float = field(default_factory=time.process_time)
    trial_s: float = 0.0
    prepare_s: float = 0.0
    trials: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``driver_cpu_s``: this process's CPU time while it ran trials (asking, decoding,
        polling, telling, the record); ``process_cpu_s``: all of it since it started (imports,
        checks, data preparation included); ``overhead``: the first over the trials' wall time."""
        cpu = time.process_time() - self.cpu0
        return {"wall_s": round(time.monotonic() - self.started, 3), "driver_cpu_s": round(cpu, 3),
                "process_cpu_s": round(time.process_time(), 3), "prepare_s": round(self.prepare_s, 3),
                "trials_run": self.trials, "trial_wall_s": round(self.trial_s, 3),
                "overhead": round(cpu / self.trial_s, 5) if self.trial_s else None,
                "process_overhead": round(time.process_time() / self.trial_s, 5) if self.trial_s else None}


class Driver:
    """Runs the search's trials from the store until the search has its trials."""

    def __init__(self, search: Search, search_dir: Path, study: Any, *, jobs: int, threads: int, main: bool,
                 echo: Callable[[str], None], launcher: LocalLauncher | RayLauncher | None = None) -> None:
        self.search, self.dir, self.study, self.jobs, self.threads = search, search_dir, study, jobs, threads
        self.main, self.echo = main, echo
        self.launcher = launcher or LocalLauncher()
        self.lock = threading.RLock()  # the study's sampler, its storage writes and the record
        self.stopping = threading.Event()
        self.ended = threading.Event()
        self.running: dict[int, threading.Thread] = {}
        self.claims: dict[int, FileLock] = {}
        self.runs: list[Launched] = []
        self.failed: list[int] = []
        self.timing = Timing()
        self.target = search.config.trials

    # ---- the store's count ---------------------------------------------------------------------

    def _trials(self, *states: str) -> list[Any]:
        return [t for t in self.study.get_trials(deepcopy=False) if not states or t.state.name in states]

    def _stored(self, number: int) -> Any:
        """Trial ``number`` as the store has it now."""
        storage = self.study._storage
        return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number))

    def _want_more(self) -> bool:
        """True while the search needs another trial asked: a named plan still queued, or fewer
        trials finished or running than its count (failures never count; as many failures as
        trials stop it)."""
        counts = Counter(t.state.name for t in self._trials())
        if counts["FAIL"] >= self.target:
            return False
        return counts["WAITING"] > 0 or counts["COMPLETE"] + counts["PRUNED"] + counts["RUNNING"] < self.target

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Take up orphaned trials, ask new ones, until none is left to run (the main driver
        also waits for other drivers' trials)."""
        with sigterm_interrupts():
            try:
                while True:
                    self._reap()
                    self._adopt()
                    while len(self.running) < self.jobs:
                        # counting and asking are one step across drivers, or two could ask for the last trial
                        with FileLock(self.dir / "locks" / "ask.lock"):
                            if not self._want_more():
                                break
                            with self.lock:
                                trial = self.study.ask()
                            claimed = self._claim(trial.number)
                        if claimed:  # else another driver took it up between the ask and the claim
                            self._start_safely(trial)
                    if not self.running and not self._want_more():
                        others = [t.number for t in self._trials("RUNNING") if t.number not in self.running]
                        if not self.main or not others:
                            break
                    self.ended.wait(WAIT_S)
                    self.ended.clear()
            except KeyboardInterrupt:
                self._stop()
                raise
            finally:
                for claim in self.claims.values():
                    claim.release()

    def _reap(self) -> None:
        for number, thread in list(self.running.items()):
            if not thread.is_alive():
                thread.join()
                del self.running[number]
                self.claims.pop(number).release()

    def _adopt(self) -> None:
        """Take up running trials whose driver is gone (their claim is free), oldest first."""
        for t in sorted(self._trials("RUNNING"), key=lambda t: t.number):
            if len(self.running) >= self.jobs:
                return
            if t.number in self.running or not self._claim(t.number):
                continue
            import optuna

            with self.lock:
                trial = optuna.Trial(self.study, t._trial_id)
            self._start_safely(trial, adopted=True)

    def _claim(self, number: int) -> bool:
        claim = FileLock(self.dir / "locks" / f"{layout.trial_name(number)}.claim")
        if not claim.acquire():
            return False
        # a trial that ended between the look and the claim is left alone
        if self._stored(number).state.name != "RUNNING":
            claim.release()
            return False
        self.claims[number] = claim
        return True

    def _stop(self) -> None:
        """Tell every trial's run to checkpoint and stop (its trial stays running in the store, to
        be taken up by the next driver) and give the runs :data:`GRACE_S` to end."""
        self.stopping.set()
        for run in self.runs:
            if not run.poll():
                run.stop()
        deadline = time.monotonic() + GRACE_S
        for thread in self.running.values():
            thread.join(timeout=max(0.1, deadline - time.monotonic()))

    # ---- one trial -----------------------------------------------------------------------------

    def _start_safely(self, trial: Any, adopted: bool = False) -> None:
        """:meth:`_start`; a trial that cannot start (its plan refused: a bug) fails, rather than
        stay running for the next driver to try again."""
        try:
            self._start(trial, adopted)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the trial must end
            self.running.pop(trial.number, None)
            self._fail(trial, f"{type(exc).__name__}: {exc}")
            self.claims.pop(trial.number).release()

    def _fail(self, trial: Any, note: str) -> None:
        import optuna

        with self.lock:
            trial.set_user_attr("note", " ".join(note.split())[:300])
            self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            write_record(self.dir, self.search, self.study.get_trials(deepcopy=False))
        self.failed.append(trial.number)
        self.echo(f"  trial {layout.trial_name(trial.number)} failed: {note}")

    def _start(self, trial: Any, adopted: bool = False) -> None:
        """Decode the trial's plan (its numbers: sampled now, or stored), record it, then run it
        in a thread."""
        t0 = time.monotonic()
        search = self.search
        from headwise.search.store import draw

        with self.lock:
            plan, lr = draw(search, trial)
            repaired = self.study.sampler.repairs.pop(trial.number, {})
        config = search.trial_config(plan, lr)
        budget = search.budget_of(plan)
        if search.config.budget is not None and search.space.predicted(plan) != budget[search.config.budget.metric]:
            raise AssertionError(f"trial {trial.number}: the space computed {search.space.predicted(plan)} for "
                                 f"{search.config.budget.metric}, the plan's spec {budget[search.config.budget.metric]}")
        paths = layout.trial_paths(self.dir, trial.number)
        attrs = {"depth": plan.n_layers, "heads": list(plan.heads), "head_dims": list(plan.head_dims),
                 "kv_heads": list(plan.kv_heads) if search.space.sets_kv_heads or search.space.base.kv_heads else [],
                 "mlp_hidden": list(plan.mlp_hidden) if search.space.sets_mlp else [], "budget": budget, "lr": lr,
                 "run_dir": str(paths["run_dir"].relative_to(self.dir)), "config_key": short_hash(config)}
        if repaired:  # what the sampler proposed for the values it repaired to keep the budget
            attrs["repaired"] = repaired
        with self.lock:
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            write_record(self.dir, self.search, self.study.get_trials(deepcopy=False))  # it is running
        job = RunJob(spec=RunSpec(f"trial{layout.trial_name(trial.number)}", search.config.fidelity.run_seed, {},
                                  copy.deepcopy(config)), action="start", **paths)
        original = self._original(trial.number, attrs["config_key"])
        self.echo(f"  {'resuming' if adopted else 'started'} trial {layout.trial_name(trial.number)}: {plan.describe()}"
                  + (f", lr {lr:.3g}" if lr is not None else "")
                  + (f" (the run of trial {original})" if original is not None else ""))
        thread = threading.Thread(target=self._execute, args=(trial, plan, job, budget, original),
                                  name=f"trial-{trial.number}", daemon=True)
        self.running[trial.number] = thread
        self.timing.prepare_s += time.monotonic() - t0
        thread.start()

    def _original(self, number: int, key: str) -> int | None:
        """The earliest other trial with the same run config that has not failed, if any."""
        for t in sorted(self._trials("COMPLETE", "PRUNED", "RUNNING"), key=lambda t: t.number):
            if t.number < number and t.user_attrs.get("config_key") == key and t.user_attrs.get("duplicate_of") is None:
                return t.number
        return None

    def _execute(self, trial: Any, plan: Plan, job: RunJob, budget: dict[str, int], original: int | None) -> None:
        try:
            outcome = self._duplicate(trial, original) if original is not None else None
            if outcome is None:
                runner = TrialRun(self.search, job, trial, self.lock, self.threads, budget, self.stopping,
                                  self.runs.append, self.launcher)
                outcome = runner.run()
                with self.lock:
                    self.timing.trial_s += outcome.seconds
                    self.timing.trials += 1
            if outcome.state != "stopped":
                self._tell(trial, plan, outcome)
        except Exception as exc:  # noqa: BLE001 - a trial that cannot go on ends failed, not running
            if not self.stopping.is_set():
                self._fail(trial, f"{type(exc).__name__}: {exc}")
        finally:
            self.ended.set()

    def _duplicate(self, trial: Any, original: int) -> TrialOutcome | None:
        """Wait for the original trial to end and reuse its outcome (None: it failed, so this
        trial runs itself)."""
        while not self.stopping.is_set():
            t = self._stored(original)
            if t.state.name == "FAIL":
                return None
            if t.state.name in ("COMPLETE", "PRUNED"):
                with self.lock:
                    trial.set_user_attr("duplicate_of", original)
                    for key in ("run_dir", "steps", "last_values"):
                        if key in t.user_attrs:
                            trial.set_user_attr(key, t.user_attrs[key])
                if t.state.name == "COMPLETE":
                    return TrialOutcome("complete", values=list(t.values), steps=int(t.user_attrs.get("steps", 0)))
                last = dict(t.user_attrs.get("last_values", {}))
                return TrialOutcome("pruned", last=last, steps=int(t.user_attrs.get("steps", 0)))
            time.sleep(WAIT_S)
        return TrialOutcome("stopped")

    def _tell(self, trial: Any, plan: Plan, outcome: TrialOutcome) -> None:
        import optuna

        state = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                 "failed": optuna.trial.TrialState.FAIL}[outcome.state]
        with self.lock:
            if trial.user_attrs.get("duplicate_of") is None:
                trial.set_user_attr("steps", outcome.steps)
                if outcome.last:
                    trial.set_user_attr("last_values", outcome.last)
            if outcome.note:
                trial.set_user_attr("note", outcome.note)
            self.study.tell(trial.number, outcome.values if outcome.state == "complete" else None, state=state,
                            skip_if_finished=True)
            record = write_record(self.dir, self.search, self.study.get_trials(deepcopy=False))
        if outcome.state == "failed":
            self.failed.append(trial.number)
        done = sum(1 for r in record["trials"] if r["state"] in ("complete", "pruned", "duplicate"))
        measured = dict(zip([o.metric for o in self.search.config.objectives], outcome.values or [])) or outcome.last
        values = ", ".join(f"{k} {v:.0f}" if k in METRICS else f"{k} {v:.4f}" for k, v in measured.items())
        state_word = "duplicate" if trial.user_attrs.get("duplicate_of") is not None else outcome.state
        self.echo(f"[{done}/{self.target}] trial {layout.trial_name(trial.number)} {plan.describe()}: {state_word}"
                  + (f", {values}" if values else "") + (f" ({outcome.note})" if outcome.note and outcome.note != "pruned" else "")
                  + (f" in {outcome.seconds:.0f} s" if outcome.seconds else ""))


def startup_plans(search: Search, taken: set[Plan], k: int) -> list[Plan]:
    """``k`` distinct plans of the space, not ``taken``, drawn uniformly without repeats: the first
    ``k`` of its list shuffled with the search's seed (so a search of fewer trials draws the first
    of the same ones); none when the space holds more than :data:`LISTED` plans."""
    count = search.space.count()
    if k <= 0 or count is None or count > LISTED:
        return []
    rest = [p for p in search.space.plans() if p not in taken]
    random.Random(search.config.seed).shuffle(rest)
    return rest[:k]


def enqueue_named(search: Search, study: Any, startup: bool = True) -> None:
    """Queue the trials that run first, once per store (the study remembers it): the named plans
    the space holds, then, with TPE, :func:`startup_plans` until the queue fills TPE's random
    startup (:data:`STARTUP` trials, at most the search's), marked ``startup: uniform``.
    ``startup=False`` leaves TPE its own random startup (the sampler replay's comparison)."""
    if study.user_attrs.get("named_queued"):  # the name predates the startup plans, which it covers too
        return
    space = search.space
    named = [(n.name, space.encode(n.plan)) for n in search.named if n.in_space and n.plan is not None]
    for name, values in named:
        study.enqueue_trial(values, user_attrs={"named": name})
    if startup and search.config.sampler_kind == "tpe":
        # a named plan as the space lists it, to leave it out of the draw
        taken = {space.decode(values.__getitem__) for _, values in named}
        for plan in startup_plans(search, taken, min(STARTUP, search.config.trials) - len(named)):
            study.enqueue_trial(space.encode(plan), user_attrs={"startup": "uniform"})
    study.set_user_attr("named_queued", True)
