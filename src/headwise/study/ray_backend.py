"""Joining a Ray cluster, and preparing the runs' data on it: what the Ray launcher
(:class:`headwise.study.launch.RayLauncher`) of a study's runs and of a search's trials stands on.

Runs on Ray need headwise installed on every node and their output folder on a filesystem that
every node sees at the same path (the launcher checks it). Before any run (and before the output
folder is made) the preflight joins the cluster (:func:`connect`: an address where nothing listens
is refused in seconds), refuses CUDA runs on a cluster without GPUs and prepares each distinct
``[task]`` table's data in a Ray task (:func:`prepare_on_cluster`), so data that the cluster cannot
find stops the command at once. The runs read data as their node sees it (``HEADWISE_DATA`` and
``HEADWISE_CACHE`` of the node): a cluster without a shared cache folder tokenizes again on each
node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from typing import Any, Callable, Iterator

from headwise.errors import HeadwiseError, RunFailure, sigterm_interrupts
from headwise.study.preflight import check_data, check_devices, prepare_task_data
from headwise.study.definition import RunSpec

#: seconds a Ray address gets to accept a TCP connection before it is called unreachable
PROBE_S = 3.0
#: seconds a cluster that accepts the connection gets to let the driver join it: Ray itself
#: retries a silent address for ever; its client gives up after 30 s, and says why
JOIN_S = 45.0
#: the Ray client's port when a ray:// address names none
CLIENT_PORT = 10001


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
def _quiet_stderr(still_joining: Callable[[], bool]) -> Iterator[None]:
    """Send this process's file descriptor 2 to /dev/null: Ray's C++ core logs its retries there
    while it joins, past Python's logging. A join still going at the end goes on logging there
    until the process exits, so descriptor 2 stays quiet and Python's own stderr (the refusal's
    one line) writes to the real one."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        if still_joining():
            sys.stderr = os.fdopen(saved, "w", buffering=1)
        else:
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
    with sigterm_interrupts(), _quiet_stderr(thread.is_alive):
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

