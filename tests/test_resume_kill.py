"""Never lose work: a run killed with SIGKILL (mid-step, or in the middle of writing a
checkpoint) and then resumed records exactly the losses of the uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.model import load_pretrained
from headwise.train import run_training
from headwise.train.checkpoint import latest_checkpoint, load_state
from headwise.run import read_metrics, read_summary
from test_train_synthetic import SyntheticLM, tiny_config

pytestmark = pytest.mark.slow  # each test kills or signals a training process
TESTS = Path(__file__).resolve().parent
# dropout makes the losses depend on the random generators, which checkpoints must restore
RUN = dict(steps=14, ckpt_every=4, eval_every=4, keep=3, dropout=0.1)

# Trains the same run in a child process. "slow" sleeps in every batch so that the parent can
# kill it mid-run; "hang-in-save" blocks inside the step-8 checkpoint write, after the files are
# written but before they are fsynced and renamed into place.
SCRIPT = f"""
import sys, time
sys.path.insert(0, {str(TESTS)!r})
import headwise.train.checkpoint as checkpoint
from headwise.train import run_training
from test_train_synthetic import SyntheticLM, tiny_config

out, mode, marker = sys.argv[1:4]
if mode == "hang-in-save":
    real = checkpoint._fsync_tree
    def hang(directory):
        if directory.name.endswith("step_00000008"):
            open(marker, "w").close()
            time.sleep(300)
        real(directory)
    checkpoint._fsync_tree = hang
run_training(tiny_config(**{RUN!r}), out, task=SyntheticLM(delay=0.05 if mode == "slow" else 0.0))
"""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[tuple]:
    out = tmp_path_factory.mktemp("whole") / "run"
    run_training(tiny_config(**RUN), out, task=SyntheticLM())
    return _curve(out)


def _curve(run_dir: Path) -> list[tuple]:
    return [(r["step"], r["train_loss"], r.get("eval_loss")) for r in read_metrics(run_dir)]


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    out, marker = tmp_path / "run", tmp_path / "in-save"
    child = subprocess.Popen([sys.executable, str(script), str(out), mode, str(marker)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return child, out, marker


def _wait(condition, child: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if child.poll() is not None:
            raise AssertionError(f"the child exited early: {child.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError("timed out waiting for the child")
        time.sleep(0.02)


def test_sigkill_mid_run_then_resume_is_exact(tmp_path, uninterrupted):
    child, out, _ = _start(tmp_path, "slow")
    # Kill once step 10 is logged: the latest checkpoint is step 8, and steps 9-10 are lost.
    _wait(lambda: any(r["step"] >= 10 for r in read_metrics(out)), child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert latest_checkpoint(out).name == "step_00000008"
    assert max(r["step"] for r in read_metrics(out)) >= 10

    summary = run_training(tiny_config(**RUN), out, resume=True, task=SyntheticLM())
    assert summary.status == "completed" and summary.steps == 14
    assert _curve(out) == uninterrupted  # the same numbers, each step once


def test_sigkill_during_a_save_keeps_the_previous_checkpoint(tmp_path, uninterrupted):
    child, out, marker = _start(tmp_path, "hang-in-save")
    _wait(marker.exists, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    # the half-written step-8 checkpoint is not the latest; step 4 is, and it loads
    latest = latest_checkpoint(out)
    assert latest.name == "step_00000004"
    assert (out / "checkpoints" / ".tmp_step_00000008").is_dir()
    assert not (out / "checkpoints" / "step_00000008").exists()
    load_pretrained(latest)
    assert load_state(latest)["step"] == 4

    run_training(tiny_config(**RUN), out, resume=True, task=SyntheticLM())
    assert _curve(out) == uninterrupted
    assert not (out / "checkpoints" / ".tmp_step_00000008").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == \
           ["latest", "step_00000008", "step_00000012", "step_00000014"]


def test_sigint_on_the_command_line_saves_and_resumes(tmp_path):
    """Ctrl-C: the CLI saves a checkpoint, says so, exits 130; --resume (with a new length) finishes."""
    out = tmp_path / "run"
    cfg = Path(__file__).resolve().parents[1] / "configs" / "nearest-tiny.toml"
    child = subprocess.Popen(
        [sys.executable, "-m", "headwise", "train", str(cfg), "--out", str(out), "--set", "train.steps=100000",
         "--set", "train.log_every=5", "--set", "checkpoint.every=0", "--set", "eval.every=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait(lambda: len(read_metrics(out)) >= 2, child)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr
    assert "SIGINT at step" in stdout and "Traceback" not in stderr
    summary = read_summary(out)
    step = summary.steps
    assert summary.status == "interrupted" and latest_checkpoint(out).name == f"step_{step:08d}"

    # the resume in this process: the same command line, without a second interpreter's start-up
    assert main(["train", "--resume", "--out", str(out), "--set", f"train.steps={step + 3}"]) == 0
    summary = read_summary(out)
    assert summary.status == "completed" and summary.steps == step + 3
    assert [r["step"] for r in read_metrics(out)][-1] == step + 3


LATE_SIGNAL = f"""
import os, signal, sys
sys.path.insert(0, {str(TESTS)!r})
from headwise.run import RunStatus
from headwise.train import run_training
from headwise.train.trainer import Trainer
from test_train_synthetic import SyntheticLM, tiny_config

write = Trainer._write_summary
def write_after_another_sigterm(self):
    # PR_SET_PDEATHSIG fires once per thread of a dying study runner: one more SIGTERM can
    # arrive while the run is writing its final summary
    if self.status is RunStatus.INTERRUPTED:
        os.kill(os.getpid(), signal.SIGTERM)
    write(self)
Trainer._write_summary = write_after_another_sigterm

def stop(position):
    if position == 3:
        os.kill(os.getpid(), signal.SIGTERM)

run_training(tiny_config(steps=10, ckpt_every=0), sys.argv[1], task=SyntheticLM(on_batch=stop))
"""


def test_a_sigterm_during_the_final_summary_does_not_lose_it(tmp_path):
    script, out = tmp_path / "late.py", tmp_path / "run"
    script.write_text(LATE_SIGNAL)
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = read_summary(out)
    assert summary.status == "interrupted" and summary.steps == 4
