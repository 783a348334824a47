"""Entry point of one study run: ``python -m headwise.study.worker LOCK -- train CONFIG --out RUN ...``.

It becomes ``python -m headwise train ...`` (``os.execv``: the same process, so the runner's
signals, exit status and log reach the run itself) with two guards a study needs:
- the run's lock file is held (:class:`headwise.locks.FileLock`) for the whole run, so a rerun of the study waits for a
  run still finishing from a killed study instead of writing into the same directory;
- on Linux the process asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so killing
  the study runner makes its runs checkpoint and stop rather than carry on unobserved.

Both survive the exec: an flock belongs to the open file description, which the exec'd program
keeps because the descriptor is made inheritable, and the parent-death signal is kept across
exec of a binary that is not set-user-ID. Running the command by exec rather than by importing
it keeps this library module independent of the command layer.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from headwise.locks import FileLock

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the lock file still prevents overlapping runs
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    """Hold the lock named by ``argv[0]``, then replace this process with the headwise command
    after ``--``; returns only on bad usage."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m headwise.study.worker LOCKFILE -- COMMAND ...", file=sys.stderr)
        return 2
    # the runner passes its pid: if it died before prctl took effect, getppid() differs already
    _die_with_parent(int(os.environ.get("HEADWISE_PARENT_PID", os.getppid())))
    lock = FileLock(Path(argv[0]))
    lock.acquire(block=True)
    os.set_inheritable(lock.fd, True)  # held by the command until it exits
    os.execv(sys.executable, [sys.executable, "-m", "headwise", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
