"""``headwise.locks``: one exclusive file lock, across real processes: a second process cannot take
a held lock (waiting for it when it blocks), can once it is released, and a lock dies with its
process; ``held`` probes without taking or making anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headwise.locks import FileLock, held

from helpers import wait_for

#: a process that takes the lock at argv[1] (blocking when argv[2] is "block"), prints whether it
#: got it, then holds it until its stdin closes
TAKER = """
import sys
from headwise.locks import FileLock
lock = FileLock(sys.argv[1])
print(lock.acquire(block=sys.argv[2] == "block"), flush=True)
sys.stdin.read()
"""


def _taker(path: Path, block: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TAKER, str(path), "block" if block else "try"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _answer(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline().strip()
    proc.stdin.close()
    proc.wait(timeout=30)
    return line


def test_another_process_cannot_take_a_held_lock_and_can_after_release(tmp_path):
    path = tmp_path / "sub" / "x.lock"  # its folder is made
    lock = FileLock(path)
    assert lock.acquire() and path.is_file()
    assert _answer(_taker(path)) == "False"
    assert held(path)
    lock.release()
    lock.release()  # a second release is nothing
    assert not held(path)
    assert _answer(_taker(path)) == "True"


def test_a_blocking_acquire_waits_for_the_release(tmp_path):
    path = tmp_path / "x.lock"
    with FileLock(path) as lock:
        assert lock.fd is not None
        waiter = _taker(path, block=True)
        time.sleep(1.0)
        assert waiter.poll() is None  # still waiting
    assert _answer(waiter) == "True"


@pytest.mark.slow
def test_a_lock_dies_with_its_process(tmp_path):
    path = tmp_path / "x.lock"
    holder = _taker(path)
    assert holder.stdout.readline().strip() == "True"
    assert held(path) and not FileLock(path).acquire()
    holder.send_signal(signal.SIGKILL)  # no release: the kernel closes its descriptor
    holder.wait(timeout=30)
    wait_for(lambda: not held(path), 10, "the dead process's lock to go")
    lock = FileLock(path)
    assert lock.acquire()
    lock.release()


def test_held_makes_no_file(tmp_path):
    assert not held(tmp_path / "none.lock")
    assert not (tmp_path / "none.lock").exists()
