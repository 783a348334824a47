"""The study worker: it waits for its run's lock, then becomes ``python -m headwise train ...``
(same process) and that run holds the lock until it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from headwise.locks import FileLock, held
from headwise.study.worker import main

from helpers import tiny_nearest_config, wait_for

CONFIG = tiny_nearest_config(steps=1_000_000, log_every=1, every=1_000_000)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_bad_usage_exits_2(capsys):
    assert main(["lock"]) == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.slow
def test_the_run_holds_the_lock_after_the_worker_waited_for_it(tmp_path):
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("needs /proc to see what the process runs")
    config, run, lock = tmp_path / "run.toml", tmp_path / "run", tmp_path / "run.lock"
    config.write_text(tomli_w.dumps(CONFIG))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = FileLock(lock)  # a run of an earlier study, still finishing
    assert holder.acquire()
    proc = subprocess.Popen([sys.executable, "-m", "headwise.study.worker", str(lock), "--",
                             "train", str(config), "--out", str(run)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # a worker that did not wait would have exec'd the run within a fraction of it
        assert proc.poll() is None and "headwise.study.worker" in _cmdline(proc.pid)  # still waiting
        assert not run.exists()
        holder.release()
        metrics = run / "metrics.jsonl"
        wait_for(lambda: proc.poll() is not None or (metrics.is_file() and metrics.stat().st_size > 0), 120,
                  "the run to train")
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        assert _cmdline(proc.pid)[1:4] == ["-m", "headwise", "train"]  # the same process, exec'd
        assert held(lock)
        proc.send_signal(signal.SIGTERM)  # as the runner stops its runs
        proc.wait(timeout=60)
    finally:
        holder.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not held(lock)
