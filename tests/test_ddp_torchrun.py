"""Data parallelism: ``torchrun --nproc_per_node=2`` on CPU (gloo) follows the loss curve of one
process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.errors import HeadwiseError
from headwise.train import run_training
from headwise.train.checkpoint import latest_checkpoint, load_state
from headwise.run import read_metrics, read_summary
from test_image_task import idx_folder  # noqa: F401  (a fixture)
from test_train_synthetic import SyntheticLM, tiny_config

pytestmark = pytest.mark.slow  # torchrun
TESTS = Path(__file__).resolve().parent
RUN = dict(steps=6, ckpt_every=3, eval_every=3)

SCRIPT = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from headwise.train import run_training
from test_train_synthetic import SyntheticLM, tiny_config
run_training(tiny_config(micro_batch=2, **{RUN!r}), sys.argv[1], task=SyntheticLM())
"""


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    single = tmp_path / "single"
    run_training(tiny_config(micro_batch=4, **RUN), single, task=SyntheticLM())

    script, ddp = tmp_path / "ddp.py", tmp_path / "ddp"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(ddp)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    one, two = read_metrics(single), read_metrics(ddp)
    assert [r["step"] for r in two] == [1, 2, 3, 4, 5, 6]  # rank 0 alone writes
    assert [r["train_loss"] for r in two] == pytest.approx([r["train_loss"] for r in one], abs=1e-5)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one], abs=1e-5)
    # steps compared exactly, losses approximately (pytest >= 9.2's approx takes no nested data)
    evals_two, evals_one = ([r for r in rows if "eval_loss" in r] for rows in (two, one))
    assert evals_one and [r["step"] for r in evals_two] == [r["step"] for r in evals_one]
    assert [r["eval_loss"] for r in evals_two] == pytest.approx([r["eval_loss"] for r in evals_one], abs=1e-5)
    summary = read_summary(ddp)
    assert summary.world_size == 2 and summary.tokens == 6 * 4 * 16 and summary.status == "completed"
    # each process's data position is in the checkpoint
    ranks = load_state(latest_checkpoint(ddp))["ranks"]
    assert [r["stream"]["position"] for r in ranks] == [6, 6]
    # a checkpoint of 2 processes resumes only with 2 (the data positions are per process)
    with pytest.raises(HeadwiseError, match="written by 2 processes.*--nproc_per_node=2"):
        run_training(tiny_config(micro_batch=2, **{**RUN, "steps": 8}), ddp, resume=True, task=SyntheticLM())


IMAGE_SCRIPT = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from headwise.train import run_training
from test_image_task import vit_config
from pathlib import Path
cfg = vit_config(Path(sys.argv[2]), Path(sys.argv[3]), steps=4, micro_batch=4)
cfg.task.augment.crop_padding = 0
run_training(cfg, sys.argv[1])
"""


def test_two_processes_train_a_vit_as_one(tmp_path, idx_folder):
    """Image batches are shared out by rank like token blocks: two processes of 4 images each
    follow one process of 8 (unaugmented, so the pixels are the same)."""
    from test_image_task import vit_config

    cache = tmp_path / "cache"
    cfg = vit_config(idx_folder, cache, steps=4, micro_batch=8)
    cfg.task.augment.crop_padding = 0
    run_training(cfg, tmp_path / "single")
    script = tmp_path / "ddp_vit.py"
    script.write_text(IMAGE_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
         str(tmp_path / "ddp"), str(idx_folder), str(cache)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = read_metrics(tmp_path / "single"), read_metrics(tmp_path / "ddp")
    assert [r["train_loss"] for r in two] == pytest.approx([r["train_loss"] for r in one], abs=1e-5)
    assert read_summary(tmp_path / "ddp").eval_metrics["accuracy"] == \
        pytest.approx(read_summary(tmp_path / "single").eval_metrics["accuracy"], abs=1e-6)
