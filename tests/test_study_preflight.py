"""A study checks what all its runs share (data, device, output directory) before any run starts
and before it writes anything: a study that cannot run is one line on stderr, exit 2, and no
study directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from headwise.cli import main

MODEL = {"preset": "tiny-lm", "d_model": 8, "n_layers": 1, "heads": 1, "head_dim": 8, "mlp_hidden": 16,
         "max_seq_len": 16}
TRAIN = {"micro_batch": 2, "steps": 2, "device": "cpu", "log_every": 1}


def lm_study(path: Path, task: dict, train: dict | None = None) -> Path:
    base = {"model": MODEL, "task": {"kind": "lm", "block_size": 16, "tokenizer": "bpe:300", **task},
            "train": {**TRAIN, **(train or {})}, "eval": {"every": 2}}
    path.write_text(tomli_w.dumps({"name": "pre", "base": base,
                                   "variants": [{"name": "a", "set": {}}, {"name": "b", "set": {"optim.lr": 0.01}}]}))
    return path


def one_line(err: str) -> str:
    assert err.startswith("headwise: error: ") and err.count("\n") == 1, err
    return err


def test_unset_headwise_data_refuses_the_study_before_anything_is_written(tmp_path):
    # the most likely first mistake: a relative data path without HEADWISE_DATA (one that no bundled
    # sample answers to); checked in a fresh process whose environment lacks it
    src = lm_study(tmp_path / "s.toml", {"source": "my-stories.txt", "validation": "fraction:0.4"})
    out = tmp_path / "study"
    env = {k: v for k, v in os.environ.items() if k != "HEADWISE_DATA"}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), HEADWISE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "headwise", "study", str(src), "--out", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = one_line(proc.stderr)
    assert "HEADWISE_DATA is not set" in err and "no run was started" in err and "2 runs" in err
    assert not out.exists() and not (tmp_path / "cache").exists()
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.fixture
def no_data_env(monkeypatch, tmp_path):
    monkeypatch.delenv("HEADWISE_DATA", raising=False)
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))


def test_a_hub_source_offline_refuses_the_study(tmp_path, capsys, no_data_env):
    # the tests run with HF_HUB_OFFLINE=1 (conftest): the hub cannot be had
    src = lm_study(tmp_path / "s.toml", {"source": "roneneldan/TinyStories"})
    out = tmp_path / "study"
    assert main(["study", str(src), "--out", str(out), "--no-report"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "roneneldan/TinyStories" in err and "HEADWISE_DATA" in err and not out.exists()


def test_a_missing_local_source_refuses_the_study(tmp_path, capsys, no_data_env):
    src = lm_study(tmp_path / "s.toml", {"source": str(tmp_path / "absent.txt")})
    out = tmp_path / "study"
    assert main(["study", str(src), "--out", str(out), "--no-report"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "absent.txt" in err and "not found" in err
    assert not out.exists()
    # --dry-run stays cheap: it prepares no data, so it lists the variants all the same
    assert main(["study", str(src), "--dry-run"]) == 0
    assert "a " in capsys.readouterr().out and not (tmp_path / "cache").exists()


def test_data_that_cannot_fill_the_tokenizer_refuses_the_study(tmp_path, capsys, no_data_env):
    text = tmp_path / "t.txt"
    text.write_text("A cat sat.\n<|endoftext|>\nA dog ran.\n")
    src = lm_study(tmp_path / "s.toml", {"source": str(text), "validation": str(text.with_name("v.txt")),
                                         "tokenizer": "bpe:5000"})
    text.with_name("v.txt").write_text("A bird sang.\n")
    out = tmp_path / "study"
    assert main(["study", str(src), "--out", str(out), "--no-report"]) == 2
    assert "supports only" in one_line(capsys.readouterr().err) and not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_runs_on_a_machine_without_cuda_are_refused(tmp_path, capsys, no_data_env):
    src = lm_study(tmp_path / "s.toml", {"source": str(tmp_path / "absent.txt")}, train={"device": "cuda"})
    out = tmp_path / "study"
    assert main(["study", str(src), "--out", str(out), "--no-report"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "run a/seed0 and 1 more set train.device = 'cuda'" in err and "no CUDA device" in err
    assert not out.exists()


def test_an_out_dir_that_cannot_be_made_is_refused(tmp_path, capsys, no_data_env):
    src = lm_study(tmp_path / "s.toml", {"source": str(tmp_path / "absent.txt")})
    (tmp_path / "file").write_text("mine")
    assert main(["study", str(src), "--out", str(tmp_path / "file" / "study"), "--no-report"]) == 2
    assert "is a file" in one_line(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "mine"
