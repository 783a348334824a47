"""``[train.prune]``: a run that prunes its ``train.init_from`` model before it trains. Right after
pruning its model computes what the source computes with the removed heads gated off; the heads
scored are the run's training batches' (the gradient method's own scores, recomputed here); a
resume rebuilds the saved shape without scoring again; bad input is one line, exit 2, nothing
written. And the built-in ``prune`` study resolves (quick: a dry run)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from conftest import REPO, shared_data_dir
from headwise.analysis.head_importance import gradient_scores, head_gates, head_shapes
from headwise.cli import main
from headwise.text.packing import PackedStream
from headwise.tasks.union import build_task
from headwise.train import prune_init
from headwise.train.config import RunConfig
from headwise.train.distributed import init_distributed
from headwise.train.generate import load_run_model
from headwise.train.trainer import Trainer, run_training
from helpers import LM_TINY, one_thread, train_lm_tiny  # noqa: F401  (one torch thread)

CONFIG = REPO / "configs" / "lm-tiny.toml"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 2-step lm-tiny run (heads 4, 2) to prune."""
    return train_lm_tiny(tmp_path_factory.mktemp("prune-source"), 2)


@pytest.fixture(autouse=True)
def data(source, monkeypatch):
    monkeypatch.setenv("HEADWISE_DATA", str(shared_data_dir()))
    monkeypatch.setenv("HEADWISE_CACHE", str(source.parent / "cache"))


def _config(source: Path, *settings: str) -> RunConfig:
    pairs = [LM_TINY[i + 1] for i in range(0, len(LM_TINY), 2)]
    return RunConfig.load(CONFIG, [*pairs, f"train.init_from={source}", "train.prune.to=heads:4",
                                   "train.prune.tokens=64", *settings])


def _gates(model, removed) -> list[torch.Tensor]:
    gates = []
    for shape, gone in zip(head_shapes(model), removed):
        gate = torch.ones(shape.heads)
        gate[list(gone)] = 0
        gates.append(gate)
    return gates


def test_the_pruned_model_is_the_source_with_the_lowest_gradient_heads_gated(source, tmp_path):
    cfg = _config(source, "train.steps=1")
    out = tmp_path / "pruned"
    ctx = init_distributed("cpu")
    try:
        trainer = Trainer(cfg, out, ctx, resume=False, overwrite=False, task=None)
    finally:
        ctx.close()
    record = json.loads((out / "pruned.json").read_text())
    original, _ = load_run_model(source)
    # scored on the run's own training batches (seed 0), by the gradient method
    task = build_task(cfg.task)
    inputs, targets = prune_init.training_sample(task, 64, seed=0)
    want = gradient_scores(original.eval(), inputs, targets, task.loss)
    got = [layer["heads"] for layer in record["head_scores"]["layers"]]
    for layer, mine in zip(want.layers, got):
        assert mine == pytest.approx(layer.heads, rel=1e-5)
    # heads:4 of [4, 2]: the two lowest-scoring heads go (each layer keeps one)
    ranked = sorted((s, i, h) for i, layer in enumerate(want.layers) for h, s in enumerate(layer.heads))
    assert record["removed"] == _lowest_two(ranked)
    assert trainer.spec.heads == [4 - len(record["removed"][0]), 2 - len(record["removed"][1])]
    assert sum(trainer.spec.heads) == 4 and trainer.summary().plan.heads == tuple(trainer.spec.heads)
    ids = torch.randint(0, original.spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), head_gates(original, _gates(original, record["removed"])):
        gated = original(ids)
    with torch.no_grad():
        torch.testing.assert_close(trainer.model.eval()(ids), gated, rtol=1e-5, atol=1e-5)
    # the saved config's [model] is the source's: training it again prunes the same way
    assert RunConfig.load(out / "config.toml").train.prune.to == "heads:4"


def _lowest_two(ranked) -> list[list[int]]:
    """The heads a global heads:4 budget removes from [4, 2]: the lowest first, each layer keeping one."""
    removed: list[list[int]] = [[], []]
    for _, i, h in ranked:
        if sum(map(len, removed)) == 2:
            break
        if len(removed[i]) < (3, 1)[i]:
            removed[i].append(h)
    return [sorted(r) for r in removed]


def test_a_resumed_run_rebuilds_the_pruned_shape_without_scoring_again(source, tmp_path, monkeypatch):
    cfg = _config(source, "train.steps=3", "train.distill.teacher=" + str(source))
    original = PackedStream.__next__
    calls = {"n": 0}

    def stop_at_step_two(self):
        calls["n"] += 1
        if calls["n"] == 2 + 2:  # the two scoring sequences, then step 2's micro-batch: stop there
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(PackedStream, "__next__", stop_at_step_two)
    out = tmp_path / "healed"
    assert run_training(cfg, out).status == "interrupted"
    monkeypatch.setattr(PackedStream, "__next__", original)
    before = (out / "pruned.json").read_text()

    def no_scoring(*args, **kwargs):
        raise AssertionError("a resumed run scored its source again")

    monkeypatch.setattr(prune_init, "score_heads", no_scoring)
    summary = run_training(cfg, out, resume=True)
    assert summary.status == "completed" and summary.steps == 3 and sum(summary.plan.heads) == 4
    assert (out / "pruned.json").read_text() == before
    assert load_run_model(out)[0].spec.heads == list(summary.plan.heads)


def _refused(capsys, out: Path, *args: str) -> str:
    assert main(["train", str(CONFIG), "--out", str(out), *(a for s in args for a in ("--set", s)), *LM_TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    return err


def test_bad_input_is_one_line_exit_2_and_nothing_written(source, tmp_path, capsys):
    out = tmp_path / "run"
    assert "set train.init_from too" in _refused(capsys, out, "train.prune.to=heads:4", "train.steps=1")
    assert "unknown budget 'bytes'" in _refused(capsys, out, f"train.init_from={source}", "train.prune.to=bytes:4",
                                                "train.steps=1")
    assert "no pruning meets the budget" in _refused(capsys, out, f"train.init_from={source}",
                                                     "train.prune.to=heads:1", "train.steps=1")
    assert "already meets the budget" in _refused(capsys, out, f"train.init_from={source}",
                                                  "train.prune.to=heads:6", "train.steps=1")
    assert "scope" in _refused(capsys, out, f"train.init_from={source}", "train.prune.to=heads:4",
                               "train.prune.scope=uniform", "train.steps=1")


def test_the_quick_prune_study_resolves_with_its_two_stages(tmp_path, capsys):
    assert main(["study", "prune", "--preset", "quick", "--dry-run", "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    assert "baseline        heads 24,24,24,24 (total 96, constant)" in out
    assert "descending-h48  heads 24,12,6,3 (total 45, descending)" in out and "train.steps=140" in out
    assert "stage prune-global" in out and "stage prune-uniform" in out
    assert not (tmp_path / "study").exists()


def test_the_prune_verdict_resolves_with_its_claims_on_the_stages_runs(tmp_path, capsys):
    from headwise.study import load_study

    assert main(["study", "prune", "--preset", "verdict", "--dry-run", "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    assert "study prune (preset verdict): 4 variants x 5 seeds" in out
    assert "descending-h96  heads 48,24,12,6 (total 90, descending)" in out and "train.steps=800" in out
    assert not (tmp_path / "study").exists()
    study = load_study("prune", preset="verdict")
    # only the baseline is pruned, and every compared model saw the baseline's steps plus the heal steps
    assert [s.variants for s in study.config.stages] == [["baseline"], ["baseline"]]
    steps = {v.name: v.config["train"]["steps"] for v in study.variants}
    heal = study.config.stages[0].config["train"]["steps"]
    assert steps == {"baseline": 600, **{f"{s}-h96": 600 + heal for s in ("constant", "ascending", "descending")}}
    for v in study.variants:
        assert v.config["task"]["validation"] == "fraction:0.1:1/2" and v.config["task"]["eval_batches"] == 0
    better, as_good = study.config.claims
    assert (better.test, better.pairs) == ("better", [("prune-global/baseline", "prune-uniform/baseline")])
    assert as_good.test == "as_good" and as_good.margin_percent == 1.0
    assert as_good.pairs == [("prune-global/baseline", "descending-h96"), ("prune-global/baseline", "constant-h96")]
