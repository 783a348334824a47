"""Entry point of one study run: ``python -m headwise.study.worker LOCK -- train CONFIG --out RUN ...``.

It is ``python -m headwise train ...`` with two guards a study needs:
- the run's lock file is held (``flock``) for the whole run, so a rerun of the study waits for a
  run still finishing from a killed study instead of writing into the same directory;
- on Linux the process asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so killing
  the study runner makes its runs checkpoint and stop rather than carry on unobserved.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import sys

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
    """Hold the lock named by ``argv[0]`` and run the headwise command after ``--``."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m headwise.study.worker LOCKFILE -- COMMAND ...", file=sys.stderr)
        return 2
    # the runner passes its pid: if it died before prctl took effect, getppid() differs already
    _die_with_parent(int(os.environ.get("HEADWISE_PARENT_PID", os.getppid())))
    lock = open(argv[0], "a+")  # noqa: SIM115 - held until the process exits
    fcntl.flock(lock, fcntl.LOCK_EX)
    from headwise.cli import main as cli_main

    return cli_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
