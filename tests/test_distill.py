"""Healing a pruned run with ``[train.distill]``: the KL at a temperature equals a hand-worked case
and torch's own ``F.kl_div``; the trainer's step-1 loss is the mix of the task loss and the KL
computed here from the two models and the first batch; alpha 0 trains exactly the plain run; a
teacher equal to the student's initial weights gives KL 0; a pruned tiny LM healed by its unpruned
source lowers its eval loss and resumes exactly after a SIGTERM; bad input is one line, exit 2,
nothing written."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, shared_data_dir
from headwise.cli import main
from headwise.config import sha256_file
from headwise.run import read_metrics
from headwise.train import RunConfig, run_training
from headwise.train.distill import distill_loss, kl_at_temperature
from headwise.train.generate import load_run_model, run_config, run_task
from helpers import LM_TINY, one_thread, train_lm_tiny  # noqa: F401  (one torch thread)


def test_kl_at_a_temperature_by_hand_and_by_torch():
    # two tokens: the teacher's logits (ln 3, 0) are p = (3/4, 1/4) at T = 1, the student's uniform
    student, teacher = torch.zeros(1, 2), torch.tensor([[math.log(3.0), 0.0]])
    want = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert kl_at_temperature(student, teacher, 1.0).item() == pytest.approx(want, rel=1e-6)
    # T = 2 halves the logits: p = (sqrt 3, 1) / (sqrt 3 + 1)
    p = [math.sqrt(3.0) / (math.sqrt(3.0) + 1), 1 / (math.sqrt(3.0) + 1)]
    want = sum(q * math.log(q / 0.5) for q in p)
    assert kl_at_temperature(student, teacher, 2.0).item() == pytest.approx(want, rel=1e-5)
    # over tokens [B, T, V], against torch's KL (input: the student's log-probabilities)
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 5, 11, generator=g) * 3, torch.randn(3, 5, 11, generator=g) * 3
    for temperature in (0.5, 1.0, 4.0):
        ref = F.kl_div(F.log_softmax(s / temperature, -1).flatten(0, 1),
                       F.log_softmax(t / temperature, -1).flatten(0, 1), log_target=True, reduction="batchmean")
        torch.testing.assert_close(kl_at_temperature(s, t, temperature), ref, rtol=1e-6, atol=1e-7)
    assert kl_at_temperature(t, t, 2.0).item() == pytest.approx(0.0, abs=1e-7)
    loss, kl = torch.tensor(2.5), torch.tensor(0.25)
    assert distill_loss(loss, kl, 0.3, 2.0).item() == pytest.approx(0.7 * 2.5 + 0.3 * 4 * 0.25)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An 80-step lm-tiny run (heads 4, 2) and its copy pruned to heads 2, 2 (by hand-made scores)."""
    root = tmp_path_factory.mktemp("distill")
    source, pruned, scores = train_lm_tiny(root, 80), root / "pruned", root / "scores.json"
    layers = [{"layer": i, "heads": h, "groups": None} for i, h in enumerate([[0.3, 0.1, 0.9, 0.8], [0.6, 0.7]])]
    sha = sha256_file(source / "model" / "model.safetensors")  # scores name the weights they scored
    scores.write_text(json.dumps({"weights_sha256": sha,
                                  "methods": {"ablation": {"method": "ablation", "layers": layers}}}))
    assert main(["heads", "prune", str(source), "--to", "heads:4", "--out", str(pruned), "--method", "ablation",
                 "--scores", str(scores)]) == 0
    return root, source, pruned


def _heal(pruned: Path, steps: int, *settings: str) -> RunConfig:
    """The pruned run's config, fine-tuned from it for ``steps`` steps, with ``settings`` (key=value)."""
    overrides = [s for s in LM_TINY if s != "--set"] + [f"train.init_from={pruned}", f"train.steps={steps}", *settings]
    return RunConfig.load(pruned / "config.toml", overrides)


def _rows(out: Path, keys=("step", "train_loss", "grad_norm", "eval_loss")) -> list[list]:
    return [[r.get(k) for k in keys] for r in read_metrics(out)]


def test_alpha_0_trains_exactly_the_plain_run(runs, monkeypatch):
    root, source, pruned = runs
    monkeypatch.setenv("HEADWISE_CACHE", str(root / "cache"))
    plain = run_training(_heal(pruned, 3, "model.dropout=0.1"), root / "plain")
    mixed = run_training(_heal(pruned, 3, "model.dropout=0.1", f"train.distill.teacher={source}",
                               "train.distill.alpha=0.0"), root / "alpha0")
    assert plain.status == mixed.status == "completed"
    assert _rows(root / "alpha0") == _rows(root / "plain")
    # the saved config holds the table, every default filled in, the teacher's path absolute
    assert run_config(root / "alpha0").train.distill.model_dump() == {
        "teacher": str(source), "teacher_checkpoint": None, "temperature": 2.0, "alpha": 0.0}


def test_a_teacher_equal_to_the_students_start_gives_kl_0(runs, monkeypatch):
    root, _, pruned = runs
    monkeypatch.setenv("HEADWISE_CACHE", str(root / "cache"))
    run_training(_heal(pruned, 1, f"train.distill.teacher={pruned}", "train.distill.alpha=1.0"), root / "self")
    # alpha 1: the loss is T^2 KL alone
    assert read_metrics(root / "self")[0]["train_loss"] == pytest.approx(0.0, abs=1e-6)


def _interrupting(task, at: int):
    """``task``, its ``train_loss`` sending this process SIGTERM at its ``at``-th call."""
    calls, train_loss = [0], task.train_loss

    def interrupting(model, batch):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return train_loss(model, batch)

    task.train_loss = interrupting
    return task


def test_distillation_heals_the_pruned_run_and_resumes_exactly(runs, monkeypatch):
    root, source, pruned = runs
    monkeypatch.setenv("HEADWISE_CACHE", str(root / "cache"))
    cfg = _heal(pruned, 20, f"train.distill.teacher={source}", "train.distill.alpha=0.5",
                "train.distill.temperature=2.0", "optim.lr=1e-3")
    task = run_task(pruned, run_config(pruned))
    student, _ = load_run_model(pruned)
    teacher, _ = load_run_model(source)
    with torch.no_grad():
        before = sum(task.evaluate(student, b)[0].item() for b in task.eval_batches()) / len(task.eval_batches())
        # the first step's loss, from the two models and the first batch, by torch's own functions
        batch = next(task.train_stream(cfg.train.micro_batch, seed=cfg.train.seed))
        s, t = student(batch.inputs), teacher(batch.inputs)
        ce = F.cross_entropy(s.flatten(0, 1), batch.targets.flatten())
        kl = F.kl_div(F.log_softmax(s / 2, -1).flatten(0, 1), F.log_softmax(t / 2, -1).flatten(0, 1), log_target=True,
                      reduction="batchmean")
    whole = run_training(cfg, root / "healed")
    assert whole.status == "completed" and whole.final_eval_loss < before - 0.02  # 5.67 -> 5.62 when written
    assert read_metrics(root / "healed")[0]["train_loss"] == pytest.approx(0.5 * ce.item() + 0.5 * 4 * kl.item(),
                                                                          rel=1e-5)
    # SIGTERM during step 3 (the student's and the teacher's calls of each step), then --resume
    cut = run_training(cfg, root / "cut", task=_interrupting(run_task(pruned, run_config(pruned)), at=5))
    assert cut.status == "interrupted" and cut.steps == 3
    assert run_training(cfg, root / "cut", resume=True).status == "completed"
    assert _rows(root / "cut") == _rows(root / "healed")


def test_bad_input_is_one_line_exit_2_and_nothing_written(runs, tmp_path, capsys, monkeypatch):
    root, source, pruned = runs
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(root / "cache"))
    other = root / "other-vocab"
    assert main(["train", str(REPO / "configs" / "lm-tiny.toml"), "--out", str(other), "--set", "train.steps=1",
                 *LM_TINY, "--set", "task.tokenizer=bpe:512"]) == 0
    retrained = root / "other-text"  # the same size of BPE, learnt on other stories
    assert main(["train", str(REPO / "configs" / "lm-tiny.toml"), "--out", str(retrained), "--set",
                 "train.steps=1", *LM_TINY, "--set", "task.subset=100"]) == 0
    heal = ["train", str(pruned / "config.toml"), "--out", str(tmp_path / "new"), *LM_TINY, "--set",
            f"train.init_from={pruned}", "--set", "train.steps=1"]
    teacher = ["--set", f"train.distill.teacher={source}"]
    cases = [
        ([*heal, *teacher, "--set", "train.distill.alpha=1.5"], "alpha"),
        ([*heal, *teacher, "--set", "train.distill.temperature=0"], "temperature"),
        ([*heal, "--set", f"train.distill.teacher={tmp_path}"], "is not a headwise run"),
        ([*heal, *teacher, "--set", "train.distill.teacher_checkpoint=step_00000099"], "has no checkpoint"),
        ([*heal, "--set", f"train.distill.teacher={other}"], "vocab_size 512"),
        ([*heal, "--set", f"train.distill.teacher={retrained}"], "the same size is not the same vocabulary"),
        (["train", str(REPO / "configs" / "nearest-tiny.toml"), "--out", str(tmp_path / "new"), *teacher],
         "not logits over a vocabulary"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
