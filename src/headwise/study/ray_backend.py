"""The Ray backend of the study runner: each run as a Ray task (one GPU when the run is on CUDA),
on a local or remote cluster.

Needs headwise installed on every node and the study directory on a filesystem that every node
sees at the same path. Before any run (and before the study directory is made) the preflight joins
the cluster, refuses CUDA runs on a cluster without GPUs and prepares each distinct ``[task]``
table's data in a Ray task, so data that the cluster cannot find stops the study at once. The
runs read data as their node sees it (``HEADWISE_DATA`` and ``HEADWISE_CACHE`` of the node): a
cluster without a shared cache folder tokenizes again on each node.

A search's trials on Ray (:class:`headwise.search.execute.RayLauncher`) join the cluster,
prepare their data and start their worker with the same pieces: :func:`connect`,
:func:`prepare_on_cluster`, :func:`submit_run` and :func:`ray_train`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

from headwise.errors import HeadwiseError, RunFailure, sigterm_interrupts
from headwise.study.preflight import check_data, check_devices, prepare_task_data
from headwise.study.jobs import GRACE_S, Progress, RunJob, open_log
from headwise.study.definition import RunSpec

#: seconds between two looks at a Ray task's run (how soon a cancellation reaches the run)
POLL_S = 0.5
#: seconds a Ray address gets to accept a TCP connection before it is called unreachable
PROBE_S = 3.0
#: seconds a cluster that accepts the connection gets to let the driver join it: Ray itself
#: retries a silent address for ever; its client gives up after 30 s, and says why
JOIN_S = 45.0
#: the Ray client's port when a ray:// address names none
CLIENT_PORT = 10001


def ray_train(argv: list[str], log_path: str, threads: int | None) -> int:
    """The body of one Ray task: run the worker command on this node, logging to ``log_path``."""
    env = dict(os.environ)
    env["HEADWISE_PARENT_PID"] = str(os.getpid())
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            # ray.cancel raises KeyboardInterrupt in this thread without a signal, so a blocking
            # wait would not see it before the run ends: wait in short sleeps, between which it can
            while proc.poll() is None:
                time.sleep(POLL_S)
            return proc.returncode
        except BaseException:  # ray.cancel: let the run checkpoint and stop
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def ray_address(address: str | None) -> tuple[str, str] | None:
    """The address Ray will join for ``address`` (``RAY_ADDRESS`` stands in for none or ``auto``,
    as in ``ray.init``) and what gave it (``--address``, ``RAY_ADDRESS``); None when Ray starts a
    local cluster or finds a running one by itself."""
    env = os.environ.get("RAY_ADDRESS")
    if env and address in (None, "auto"):
        return env, "RAY_ADDRESS"
    if address in (None, "auto", "local"):
        return None
    return address, "--address"


def probe_address(address: str | None) -> None:
    """Refuse in one line, within :data:`PROBE_S`, a Ray address (``HOST:PORT`` or
    ``ray://HOST[:PORT]``) where nothing accepts a TCP connection: ``ray.init`` would retry it
    for minutes, printing its log lines, deaf to SIGTERM. Other forms are Ray's to judge."""
    given = ray_address(address)
    if given is None:
        return
    target, source = given
    client = target.startswith("ray://")
    rest = target.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if not colon and client:
        host, port = rest, str(CLIENT_PORT)
    if not host or not port.isdigit():
        return
    host = host.strip("[]")  # an IPv6 literal
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or type(exc).__name__
        drop = "drop --address" if source == "--address" else "unset RAY_ADDRESS"
        raise HeadwiseError(f"no Ray cluster at {host}:{port} ({source} {target}: {why}); start one with "
                            f"`ray start --head` or {drop}") from None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send this process's file descriptor 2 to /dev/null: Ray's C++ core logs its retries there
    while it joins, past Python's logging."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _join(ray: Any, target: str, **kwargs: Any) -> None:
    """``ray.init(target, ...)`` in a helper thread, waited for at most :data:`JOIN_S`: blocked in
    Ray's C++ code the main thread would run no signal handler, so SIGTERM (here an interrupt, as
    in the drivers) and Ctrl-C stop the command while it joins."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            ray.init(address=target, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failed.append(exc)

    thread = threading.Thread(target=body, name="ray-join", daemon=True)  # a stuck join does not hold the exit
    with sigterm_interrupts(), _quiet_stderr():
        thread.start()
        thread.join(JOIN_S)
    if thread.is_alive():
        raise HeadwiseError(f"the Ray cluster at {target} did not let this driver join within {JOIN_S:.0f} s: give "
                            "the head's GCS address (HOST:6379 by default) or its client's (ray://HOST:10001)")
    if failed:
        raise failed[0]


def connect(address: str | None) -> tuple[Any, bool]:
    """Ray, joined to the cluster at ``address`` (None: a local one) unless this process has
    joined one already, and whether this call started it (its caller shuts it down).

    Refuses in one line when Ray is not installed or the cluster cannot be joined (an address
    where nothing listens within seconds: :func:`probe_address`). Ray logs only its errors."""
    try:
        import ray
    except ImportError:
        raise HeadwiseError("--backend ray needs Ray: pip install 'headwise[ray]'") from None
    if ray.is_initialized():
        return ray, False
    probe_address(address)
    options = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level=logging.ERROR)
    given = ray_address(address)
    try:
        if given is None:  # starting a local cluster: Ray sets its signal handlers, which needs the main thread
            ray.init(address=address, **options)
        else:
            _join(ray, given[0], **options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise HeadwiseError(f"cannot join Ray cluster {address or '(local)'}: {exc}") from None
    return ray, True


def task_options(config: dict[str, Any], cluster_gpus: float, threads: int | None) -> dict[str, Any]:
    """The Ray task options of a run of ``config``: ``threads`` CPUs (default 1), one GPU when it
    trains on CUDA (``auto`` on a cluster with GPUs), and no retry (a rerun resumes it)."""
    device = str(config.get("train", {}).get("device", "auto"))
    gpu = device == "cuda" or (device == "auto" and cluster_gpus > 0)
    return {"num_cpus": threads or 1, "num_gpus": 1 if gpu else 0, "max_retries": 0}


def submit_run(task: Any, job: RunJob, cluster_gpus: float, threads: int | None) -> Any:
    """Start ``job``'s worker as the Ray task ``task`` (the remote :func:`ray_train`) on ``threads``
    CPUs (default 1), after the log's header line as a local run writes it (the task appends the
    run's output); the task's reference."""
    with open_log(job):
        pass
    return task.options(**task_options(job.spec.config, cluster_gpus, threads)).remote(
        job.argv(), str(job.log_path), threads or 1)


def prepare_on_cluster(ray: Any, specs: list[RunSpec], threads: int | None, echo: Callable[[str], None],
                       what: str) -> None:
    """Refuse CUDA runs on a cluster without GPUs, and prepare the runs' data on the cluster (one
    Ray task per distinct [task] table), where the runs will read it; ``what`` names the runs'
    owner (a study, a search) in the failure's message."""
    check_devices(specs, ray.cluster_resources().get("GPU", 0), "the Ray cluster")
    task = ray.remote(prepare_task_data).options(num_cpus=threads or 1, max_retries=0)

    def on_cluster(tables: list[dict[str, Any]]) -> list[str | None]:
        try:
            return ray.get([task.remote(t) for t in tables])
        except Exception as exc:  # a lost node or a crashed worker: not the user's input
            raise RunFailure(f"preparing the {what}'s data on the Ray cluster failed: {exc}") from None

    check_data(specs, echo, prepare=on_cluster)


class RayBackend:
    """Each run as a Ray task (one GPU when the run is on CUDA), on a local or remote cluster."""

    def __init__(self, jobs: int | None, address: str | None, threads: int | None) -> None:
        self.jobs, self.address, self.threads = jobs, address, threads
        self.started_here = False

    def _connect(self) -> Any:
        ray, started = connect(self.address)
        self.started_here = self.started_here or started
        return ray

    def preflight(self, specs: list[RunSpec], echo: Callable[[str], None]) -> None:
        """Join the cluster, refuse CUDA runs on a cluster without GPUs, and prepare the data on
        the cluster (one Ray task per distinct [task] table), where the runs will read it."""
        if not specs:
            return
        prepare_on_cluster(self._connect(), specs, self.threads, echo, "study")

    def close(self) -> None:
        if self.started_here:
            import ray

            ray.shutdown()
            self.started_here = False

    def run(self, jobs: list[RunJob], progress: Progress) -> None:
        ray = self._connect()
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        task = ray.remote(ray_train)
        refs: dict[Any, tuple[RunJob, float]] = {}
        queue = list(jobs)
        try:
            while queue or refs:
                while queue and (self.jobs is None or len(refs) < self.jobs):
                    job = queue.pop(0)
                    progress.started(job)
                    ref = submit_run(task, job, cluster_gpus, self.threads)
                    refs[ref] = (job, time.monotonic())
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
                for ref in ready:
                    job, t0 = refs.pop(ref)
                    try:
                        rc = ray.get(ref)
                    except Exception:  # a lost node or a crashed worker is one failed run
                        rc = None
                    progress.done(job, rc, time.monotonic() - t0)
        except KeyboardInterrupt:
            for ref in refs:
                ray.cancel(ref)
            raise
