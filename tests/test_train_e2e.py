"""The shipped configs end to end through the command line: train, evaluate, checkpoint, generate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.model import load_pretrained
from headwise.train.checkpoint import latest_checkpoint
from headwise.plans import Scheme
from headwise.run import RunSummary, read_metrics, read_summary

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _short(steps: int) -> list[str]:
    """Overrides for a shorter run: evaluate and checkpoint at half time and at the end."""
    return ["--set", f"train.steps={steps}", "--set", f"eval.every={steps // 2}",
            "--set", f"checkpoint.every={steps // 2}", "--set", f"train.log_every={steps // 4}"]


def _json_out(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_nearest_tiny_trains_and_predicts(tmp_path, capsys):
    out = tmp_path / "nearest"
    args = ["train", str(CONFIGS / "nearest-tiny.toml"), "--out", str(out), "--json", *_short(60),
            "--set", "train.micro_batch=64", "--set", "task.eval_batches=1"]
    assert main(args) == 0
    summary = RunSummary.model_validate(_json_out(capsys))
    assert summary.status == "completed" and summary.steps == 60 and summary.world_size == 1
    assert summary.heads == (1,) and summary.head_dims == (16,)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [15, 30, 45, 60]
    # unit-norm outputs in random directions score 2; the full config (300 steps) reaches ~0.66,
    # below the 0.89 learned-nothing level, and a fifth of it already gets well under 2
    assert rows[0]["train_loss"] > 1.6 and summary.task["baseline_loss"] == pytest.approx(0.886, abs=1e-3)
    assert summary.final_eval_loss == rows[-1]["eval_loss"] < rows[0]["train_loss"] - 0.3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_00000030", "step_00000060"]
    assert load_pretrained(out / "model").spec.inputs == "vectors"

    assert main(["generate", str(out), "--json"]) == 0
    trained = _json_out(capsys)
    assert trained["model"] == str(out / "model") and 0 <= trained["accuracy"] <= 1
    # one eval batch: the trainer's evaluation and `generate`'s predictions score the same batch
    assert trained["loss"] == pytest.approx(read_summary(out).final_eval_loss, rel=1e-5)
    assert trained["accuracy"] == pytest.approx(summary.eval_metrics["pick_accuracy"], rel=1e-6)
    assert rows[-1]["eval_pick_accuracy"] == summary.eval_metrics["pick_accuracy"]
    assert main(["generate", str(out), "--untrained", "--seed", "0", "--json"]) == 0
    untrained = _json_out(capsys)
    assert untrained["model"].startswith("untrained") and untrained["loss"] > trained["loss"]


def test_cli_refusals_are_one_line_exit_2(tmp_path, capsys):
    cfg = str(CONFIGS / "nearest-tiny.toml")
    assert main(["train", cfg, "--out", str(tmp_path / "a"), "--set", "train.stpes=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'steps'?" in err
    assert main(["train", cfg, "--out", str(tmp_path / "b"), "--set", "train.tokens_per_step=1000"]) == 2
    assert "not a multiple of micro_batch x seq_len x processes = 128 x 8 x 1 = 1024" in capsys.readouterr().err
    assert main(["train", cfg, "--out", str(tmp_path / "c"), "--resume"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err
    assert main(["train", "--resume"]) == 2
    assert not any(tmp_path.iterdir())  # nothing was written


def test_lm_tiny_trains_and_generates(tmp_path, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lm"
    args = ["train", str(CONFIGS / "lm-tiny.toml"), "--out", str(out), "--json", *_short(30),
            "--set", "train.micro_batch=8"]
    assert main(args) == 0
    summary = RunSummary.model_validate(_json_out(capsys))
    assert summary.status == "completed" and summary.heads == (4, 2)
    assert summary.plan.scheme is Scheme.DESCENDING and summary.task["tokenizer"] == "bpe:1024"
    rows = read_metrics(out)
    # from a uniform guess (ln 1024 = 6.93) to well below it in 30 steps
    assert rows[0]["train_loss"] == pytest.approx(math.log(1024), abs=0.5)
    assert summary.final_eval_loss < 6.2
    assert (out / "tokenizer.json").is_file() and (out / "tb").is_dir()

    prompt = "Once upon a time there was"
    assert main(["generate", str(out), "--prompt", prompt, "--max-new-tokens", "30", "--seed", "0",
                 "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"[{out / 'model'}]" and lines[1].startswith(prompt) and len("".join(lines[1:])) > len(prompt)
    ckpt = latest_checkpoint(out)
    assert main(["generate", str(out), "--checkpoint", str(ckpt), "--temperature", "0", "--max-new-tokens", "10",
                 "--json"]) == 0
    greedy = _json_out(capsys)
    assert greedy["model"] == str(ckpt) and greedy["text"]
    assert main(["generate", str(out), "--untrained", "--seed", "0", "--max-new-tokens", "10", "--json"]) == 0
    assert _json_out(capsys)["model"].startswith("untrained")
