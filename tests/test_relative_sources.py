"""A run that names other runs by relative paths (``train.init_from``, ``task.tokenizer_from``) saves
them absolute, so that ``headwise generate`` and ``headwise export`` find them from any working
directory, and a resume from where it started is the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, shared_data_dir
from headwise.cli import main
from headwise.config import read_toml
from headwise.run import read_summary
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

#: a one-layer, two-head Crammed BERT on 32-token rows of a 300-token BPE: trains in a moment
SMALL = ["--set", "train.steps=2", "--set", "train.micro_batch=4", "--set", "eval.every=0", "--set",
         "checkpoint.every=0", "--set", "model.n_layers=1", "--set", "model.heads=[2]", "--set", "model.max_seq_len=32"]
PRETRAIN = ["train", str(REPO / "configs" / "mlm-tiny.toml"), "--out", "runs/mlm", *SMALL, "--set",
            "task.tokenizer=bpe:300", "--set", "task.block_size=32", "--set", "task.eval_batches=1", "--set",
            "task.eval_batch_size=4"]
FINE_TUNE = ["train", str(REPO / "configs" / "glue-tiny.toml"), "--out", "runs/glue", *SMALL, "--set",
             "task.tokenizer_from=runs/mlm", "--set", "train.init_from=runs/mlm", "--set", "task.max_length=32"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder where a masked-LM run and a fine-tuning run of it were trained, the second naming
    the first as ``runs/mlm``."""
    root = tmp_path_factory.mktemp("relative")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        mp.chdir(root)
        assert main(PRETRAIN) == 0
        assert main(FINE_TUNE) == 0
    return root


@pytest.fixture
def elsewhere(work: Path, tmp_path: Path, monkeypatch) -> Path:
    """Another working directory, with the runs' data and caches where they were."""
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(work / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_saved_config_and_summary_name_the_source_absolutely(work: Path):
    saved = read_toml(work / "runs" / "glue" / "config.toml")
    source = str(work / "runs" / "mlm")
    assert saved["train"]["init_from"] == source and saved["task"]["tokenizer_from"] == source
    assert read_summary(work / "runs" / "glue").init_from == {"run": source, "checkpoint": None}


def test_generate_reads_the_fine_tuned_run_from_another_directory(work: Path, elsewhere: Path, capsys):
    assert main(["generate", str(work / "runs" / "glue")]) == 0, capsys.readouterr().err
    assert "held-out batch: accuracy" in capsys.readouterr().out


def test_export_reads_the_fine_tuned_run_from_another_directory(work: Path, elsewhere: Path, capsys):
    pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    assert main(["export", str(work / "runs" / "glue"), "--hf", "exported"]) == 0, capsys.readouterr().err
    assert (elsewhere / "exported" / "tokenizer.json").is_file()


def test_a_resume_from_where_the_run_started_is_the_same_run(work: Path, monkeypatch, capsys):
    """The relative names resolve to what was saved: the run is found finished, not different."""
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(work / "cache"))
    monkeypatch.chdir(work)
    assert main(FINE_TUNE) == 2
    assert "holds this run already" in capsys.readouterr().err
