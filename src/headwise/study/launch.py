"""Starting and stopping a run, here or on a Ray cluster: the one launcher of the study runner and
the search driver.

A run is its job's worker (``python -m headwise.study.worker LOCK -- train ...``,
:meth:`~headwise.study.jobs.RunJob.argv`: it holds the run's lock and dies with its parent) on
``threads`` torch threads, its output appended to its log after a header line
(:func:`~headwise.study.jobs.open_log`). :class:`LocalLauncher` starts it as a subprocess here;
:class:`RayLauncher` as a Ray task (:func:`ray_train`) that starts the same subprocess on a node
of the cluster. Either returns a :class:`Launched` handle, so what watches a run does not depend on
where it runs.

Stopping a run is SIGTERM (it checkpoints and exits), then SIGKILL if it has not ended within
:data:`~headwise.study.jobs.GRACE_S` (:func:`end_processes`): here by the launcher, on Ray by the
task on its node once the launcher asks it to, with a stop file beside the run's log (in the folder
every node sees) and a ``ray.cancel`` (which alone did not always reach a running task).

Before any run, each launcher refuses CUDA runs where there is no GPU and prepares the runs' data
where they will read it; the Ray launcher first refuses an output folder that some node does not
see at the same path (:meth:`RayLauncher.check_shared`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Protocol

from headwise.errors import HeadwiseError, RunFailure
from headwise.study.definition import RunSpec
from headwise.study.jobs import GRACE_S, RunJob, open_log
from headwise.study.preflight import check_here
from headwise.study.ray_backend import connect, prepare_on_cluster

#: seconds between two looks at a running run (on Ray: how soon a cancellation reaches it)
POLL_S = 0.5


def start_process(argv: list[str], log: IO[bytes], threads: int) -> subprocess.Popen:
    """``python ARGV`` here, its output into ``log`` (the run writes to its own copy of the
    descriptor), told its parent's pid (the worker dies with it) and to use ``threads`` torch
    (intra-op) threads."""
    env = {**os.environ, "HEADWISE_PARENT_PID": str(os.getpid()), "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)


class Launched(Protocol):
    """A run once launched, wherever it runs."""

    def poll(self) -> bool:
        """True once the run has ended (by itself, stopped, or lost)."""

    def stop(self) -> None:
        """Ask the run to checkpoint and stop (it gets SIGTERM); returns at once."""

    def wait(self) -> int | None:
        """Wait for the run to end; its exit status (None: its task was cancelled or lost)."""


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

    def wait(self) -> int | None:
        return self.proc.wait()


def end_processes(runs: list[_Process]) -> None:
    """Stop every run still running, then SIGKILL those that have not ended within
    :data:`GRACE_S` (one deadline for all)."""
    for run in runs:
        run.stop()
    deadline = time.monotonic() + GRACE_S
    for run in runs:
        try:
            run.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            run.proc.kill()


class LocalLauncher:
    """Runs as subprocesses of this machine."""

    #: seconds between two looks at its runs (a look is one waitpid: a longer pause leaves the
    #: cores idle between runs; 0.5 s made tests/test_nuisance.py's tuned study, 16 to 20 short
    #: runs in rounds, 10 s slower)
    poll_s = 0.05

    def preflight(self, specs: list[RunSpec], folder: Path, threads: int, echo: Callable[[str], None]) -> None:
        """Refuse CUDA runs on a machine without CUDA; prepare the data here."""
        check_here(specs, echo)

    def launch(self, job: RunJob, threads: int) -> Launched:
        """Start the job's worker here on ``threads`` torch threads, logging to its log."""
        with open_log(job) as log:
            return _Process(start_process(job.argv(), log, threads))

    stop_all = staticmethod(end_processes)  # SIGTERM, then SIGKILL after GRACE_S

    def close(self) -> None:
        """Nothing to give back."""


def ray_train(argv: list[str], log_path: str, threads: int, stop_path: str) -> int:
    """The body of one Ray task: run the worker command on this node, appending to ``log_path``,
    until it ends or ``stop_path`` appears (then it checkpoints and stops)."""
    with open(log_path, "ab") as log:
        run = _Process(start_process(argv, log, threads))
        try:
            # ray.cancel raises KeyboardInterrupt in this thread without a signal, so a blocking
            # wait would not see it before the run ends: wait in short sleeps, between which it can
            while not run.poll():
                if os.path.exists(stop_path):
                    end_processes([run])
                    break
                time.sleep(POLL_S)
            return run.proc.returncode
        except BaseException:  # ray.cancel: let the run checkpoint and stop
            end_processes([run])
            raise


class _RayRun:
    """A run as a Ray task (:func:`ray_train`), stopped by its own ``stop_path`` (a name no other
    launch shares, so a file a killed driver left cannot stop a later run)."""

    def __init__(self, ray: Any, ref: Any, stop_path: Path) -> None:
        self.ray, self.ref, self.stop_path = ray, ref, stop_path

    def poll(self) -> bool:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        return bool(ready)

    def stop(self) -> None:
        # the task SIGTERMs its run, which checkpoints, then ends; the file reaches a running task,
        # the cancel one still queued
        self.stop_path.touch()
        self.ray.cancel(self.ref)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.ray.get(self.ref, timeout=timeout)
        except Exception:  # noqa: BLE001 - cancelled, its node lost, or still running at the timeout
            return None
        finally:
            self.stop_path.unlink(missing_ok=True)


class RayLauncher:
    """Runs as Ray tasks on the cluster at ``address`` (None: a local one, or the one this process
    joined already), each running the job's worker (one GPU when it trains on CUDA); ``what``
    names the runs' owner (a study, a search) in refusals."""

    #: seconds between two looks at its runs (a look is a Ray wait per running task)
    poll_s = POLL_S

    def __init__(self, address: str | None, what: str = "search") -> None:
        self.address, self.what = address, what
        self.ray: Any = None
        self.started_here = False
        self.gpus = 0.0
        self.task: Any = None  # the remote ray_train, once joined
        self.lock = threading.Lock()  # a search's trials launch from their own threads

    def _connect(self) -> Any:
        with self.lock:
            if self.ray is None:
                self.ray, self.started_here = connect(self.address)
                self.gpus = self.ray.cluster_resources().get("GPU", 0)
                self.task = self.ray.remote(ray_train)
        return self.ray

    def preflight(self, specs: list[RunSpec], folder: Path, threads: int, echo: Callable[[str], None]) -> None:
        """Join the cluster, refuse an output folder some node does not see, then refuse CUDA runs
        on a cluster without GPUs and prepare the data on the cluster."""
        ray = self._connect()
        self.check_shared(ray, folder)
        prepare_on_cluster(ray, specs, threads, echo, self.what)

    def check_shared(self, ray: Any, folder: Path) -> None:
        """Refuse an output folder that an alive node with CPUs does not see at the same path: a
        probe file made here, beside it, must be visible there (the runs write into the folder and
        this process reads them from it). Nodes that join later are not checked."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = Path(os.path.abspath(folder))
        while not where.is_dir():  # the folder itself is not made before every check passes
            where = where.parent
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        probe = ray.remote(os.path.exists)  # whether the node it runs on sees a path
        fd, path = tempfile.mkstemp(prefix=".headwise-probe-", dir=where)
        os.close(fd)
        try:
            refs = [probe.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(path) for n in nodes]
            try:
                seen = ray.get(refs)
            except Exception as exc:  # a lost node or a crashed worker: not the user's input
                raise RunFailure(f"checking the {self.what} folder on the Ray cluster failed: {exc}") from None
        finally:
            os.unlink(path)
        blind = [n.get("NodeManagerAddress", n["NodeID"]) for n, ok in zip(nodes, seen) if not ok]
        if blind:
            raise HeadwiseError(f"--out {folder}: Ray node(s) {', '.join(blind)} do not see {where}; with --backend ray "
                                f"the {self.what} folder must be on a filesystem every node sees at the same path")

    def launch(self, job: RunJob, threads: int) -> Launched:
        """Start the job's worker as a Ray task (:func:`ray_train`) of ``threads`` CPUs (default 1),
        one GPU when it trains on CUDA (``auto`` on a cluster with GPUs) and no retry (a rerun
        resumes it), after the log's header line as a local run writes it (the task appends to it)."""
        ray = self._connect()
        with open_log(job):
            pass
        device = str(job.spec.config.get("train", {}).get("device", "auto"))
        gpu = device == "cuda" or (device == "auto" and self.gpus > 0)
        options = {"num_cpus": threads or 1, "num_gpus": 1 if gpu else 0, "max_retries": 0}
        stop_path = job.log_path.with_name(f"{job.log_path.name}.stop-{uuid.uuid4().hex[:12]}")
        ref = self.task.options(**options).remote(job.argv(), str(job.log_path), threads or 1, str(stop_path))
        return _RayRun(ray, ref, stop_path)

    def stop_all(self, runs: list[Launched]) -> None:
        """Stop ``runs`` (this launcher's) at once: each task stops its run as :func:`end_processes`
        does, on its node; their stop files go once they have ended (or :data:`GRACE_S` passed)."""
        for run in runs:
            run.stop()
        deadline = time.monotonic() + GRACE_S + POLL_S
        for run in runs:
            run.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """Shut down the local cluster this launcher started (a joined one is left alone)."""
        if self.started_here:
            self.ray.shutdown()
            self.started_here = False
