"""Helpers shared by several test modules: one-line error checks, the smallest run config, run
directories written by hand, a tiny language-model run trained, CSV files read back and the tiny
bench sections."""

import csv
import json
import time
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import REPO, shared_data_dir
from headwise.errors import HeadwiseError
from headwise.run import RunDir, RunSummary, write_summary

#: ``--set`` options that train configs/lm-tiny.toml in seconds: no evaluation or checkpoints, the
#: loss logged each step, 200 stories in blocks of 32
LM_TINY = ["--set", "eval.every=0", "--set", "checkpoint.every=0", "--set", "train.log_every=1", "--set",
           "task.subset=200", "--set", "task.block_size=32", "--set", "model.max_seq_len=32"]


def one_line_error(fn, *args, match=None, **kwargs):
    """Run ``fn``, expecting a HeadwiseError with a one-line message; return the message."""
    with pytest.raises(HeadwiseError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run a module's tests on one torch thread (import it into the module to apply it there).

    Tiny models gain nothing from a second thread, and on a loaded machine every parallel region
    of a tiny op waits for a descheduled worker (milliseconds each): run on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_nearest_config(steps: int, log_every: int, every: int) -> dict:
    """The smallest run config as a dict: a one-head vector model on the nearest-neighbour task
    (no data to prepare; a few steps a second), evaluated and checkpointed ``every`` steps."""
    return {
        "model": {"preset": "amsel-nn", "d_model": 8, "heads": [1], "head_dim": 8, "mlp_hidden": 16,
                  "max_seq_len": 16},
        "task": {"kind": "nearest", "dim": 8, "n_points": 4, "eval_batches": 1, "eval_batch_size": 32},
        "optim": {"lr": 0.01, "weight_decay": 0.0},
        "train": {"micro_batch": 16, "steps": steps, "device": "cpu", "log_every": log_every},
        "eval": {"every": every},
        "checkpoint": {"every": every, "keep": 1},
    }


def write_run_dir(path: Path, config: dict, summary: RunSummary, rows: list[dict], seed: int = 0) -> None:
    """A run directory as the trainer leaves it: its config (with its seed), ``summary.json`` and
    the ``metrics.jsonl`` rows."""
    rd = RunDir(path)
    path.mkdir(parents=True)
    rd.config.write_text(tomli_w.dumps({**config, "train": {**config.get("train", {}), "seed": seed}}))
    write_summary(path, summary)
    rd.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))


def train_lm_tiny(root: Path, steps: int, *settings: str) -> Path:
    """``root/run``: configs/lm-tiny.toml (GPT-Neo-style, heads 4, 2) trained ``steps`` steps on
    the TinyStories samples with :data:`LM_TINY` and ``settings`` (``key=value``), its data
    prepared in ``root/cache``."""
    from headwise.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        assert main(["train", str(REPO / "configs" / "lm-tiny.toml"), "--out", str(root / "run"), "--set",
                     f"train.steps={steps}", *LM_TINY, *(a for s in settings for a in ("--set", s))]) == 0
    return root / "run"


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV file headwise wrote, as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_sections(cfg, sections):
    """``headwise bench`` run on ``cfg`` for ``sections``, with its log lines under ``"log"``."""
    from headwise.bench import suite

    lines = []
    result = suite.run_bench(cfg, set(sections), log=lines.append)
    result["log"] = lines
    return result


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def quiet_basis(*stalls):
    """The basis of two rounds' statistics: both rounds whatever their stall (the quiet ones are
    used alone only when there are two), named by how many were quiet (stall share below 0.10, or
    unknown) in every one of ``stalls``."""
    quiet = sum(all(x is None or x < 0.10 for x in xs) for xs in zip(*stalls))
    return "2/2 quiet" if quiet == 2 else f"all 2 ({quiet} quiet)"


def two_round_ratio(num, den, num_stall, den_stall):
    """A comparison's fields for two rounds, by hand: each median is the mean of the two."""
    paired = [num[0] / den[0], num[1] / den[1]]
    return {"ratio": pytest.approx((paired[0] + paired[1]) / 2), "paired": pytest.approx(paired),
            "ratio_of_medians": pytest.approx((num[0] + num[1]) / (den[0] + den[1])),
            "basis": quiet_basis(num_stall, den_stall)}
