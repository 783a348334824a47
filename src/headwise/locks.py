"""One exclusive file lock (``flock``), the one every lock of headwise is made of: a study's or a
search's folder, a run's lock (held by its worker, then by the run it execs), a search's claims,
the peak-FLOP/s cache.

An flock belongs to the open file description: it holds until that is closed, by
:meth:`FileLock.release` or by the end of every process that shares the descriptor, so a lock
dies with its process and never outlives a crash.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any


class FileLock:
    """An exclusive flock on the file at ``path`` (made, with its folder, if missing): taken
    blocking or not (``acquire`` returns False when another holds it); as a context manager it
    waits for the lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, block: bool = False) -> bool:
        """Take the lock, waiting for it when ``block``; False when it is taken (never when ``block``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        """Give the lock back (nothing when it is not held)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "FileLock":
        self.acquire(block=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def held(path: Path) -> bool:
    """True while some process holds the lock of the file at ``path``; False when there is no
    such file (the probe makes none) or it cannot be opened."""
    if not Path(path).is_file():
        return False
    probe = FileLock(path)
    try:
        taken = probe.acquire()
    except OSError:
        return False
    probe.release()
    return not taken
